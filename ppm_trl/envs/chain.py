"""GSM-Infinite-style word problems (paper §5.2, App. C) from a random dependency DAG of quantities.

Given quantities ("There are 4 pears.") feed n derived ones ("There are 3 more figs than pears.", "The number
of plums is the product of figs and limes."); the question asks for the last. Every derived quantity is needed
for the answer; distractor quantities (given, or derived from relevant ones) are not. Statements are shuffled.
Line format (one line per derived quantity, then the answer):

    figs = 4 + 3 = 7
    plums = 7 * 2 = 14
    \\boxed{14}

Point k = the k-th derived quantity (in the reference's order), reached when the FIRST line stating it,
`name = ... = <integer>` or `name = <integer>`, ended by a newline, has the right value; the last point is the
asked quantity and is also reached by a correct final `\\boxed{}` (the outcome). Graph: reaching a quantity
obsoletes its derived premises (given quantities are not points).
"""

from __future__ import annotations

import re
from typing import Any

from ppm_trl.envs import build_row, first_statements, load_task
from ppm_trl.envs.base import SyntheticEnv
from ppm_trl.text import last_boxed

MAX_N = 30
MAX_VALUE = 99
NAMES = (
    "apples pears plums figs limes kiwis dates grapes melons lemons cherries peaches mangos berries olives beans "
    "peas nuts eggs buns cakes pies cookies rolls muffins tarts cups jars bowls plates forks spoons pens books "
    "maps coins cards dice balls kites boats cars bikes trains hats caps socks shoes coats bells drums flutes "
    "lamps clocks keys rings gems shells stones seeds leaves roses tulips daisies ducks geese hens cows goats "
    "sheep pigs owls foxes bears frogs crabs fish bees ants moths"
).split()
_LINE = re.compile(r"^\s*([A-Za-z]+)\s*=(.*)$", re.ASCII)
_INTEGER = re.compile(r"-?\d{1,12}(?:\.0+)?", re.ASCII)
_SYMBOL = {"add": "+", "sub": "-", "mul": "*"}


class _Retry(Exception):
    """A random draw hit the value bounds; start the problem again."""


def _apply(op: str, a: int, b: int) -> int:
    return {"add": a + b, "sub": a - b, "mul": a * b}[op]


def _valid(op: str, a: int, b: int) -> bool:
    value = _apply(op, a, b)
    return 1 <= value <= MAX_VALUE and not (op == "mul" and b == 1)


def _sentence(x: str, op: str, y: str, z: str | None, c: int | None) -> str:
    if z is None:
        return {"add": f"There are {c} more {x} than {y}.", "sub": f"There are {c} fewer {x} than {y}.",
                "mul": f"There are {c} times as many {x} as {y}."}[op]
    return {"add": f"There are as many {x} as {y} and {z} combined.",
            "sub": f"The number of {x} is the difference between {y} and {z}.",
            "mul": f"The number of {x} is the product of {y} and {z}."}[op]


def _parse_integer(text: str | None) -> int | None:
    if text is None or not _INTEGER.fullmatch(text.strip()):
        return None
    return int(text.strip().split(".")[0])


class _Builder:
    """Draws one problem; quantities are created in dependency order, values kept in 1..MAX_VALUE."""

    def __init__(self, n: int, rng):
        self.n, self.rng = n, rng
        self.names = rng.sample(NAMES, len(NAMES))
        self.values: dict[str, int] = {}
        self.sentences: list[str] = []
        self.bases: list[str] = []
        self.max_bases = max(2, n // 2 + 1)

    def base(self) -> str:
        if self.bases and (len(self.bases) >= self.max_bases or self.rng.random() < 0.4):
            return self.rng.choice(self.bases)
        name = self.names.pop()
        self.values[name] = self.rng.randint(1, 9)
        self.bases.append(name)
        self.sentences.append(f"There are {self.values[name]} {name}.")
        return name

    def derive(self, left: str, right: str | None) -> tuple[str, str]:
        """New quantity = left (op) right, or left (op) a constant when right is None; returns (name, line)."""
        a = self.values[left]
        for op in self.rng.sample(list(_SYMBOL), 3):
            if right is not None:
                if not _valid(op, a, self.values[right]):
                    continue
                b, z, c = self.values[right], right, None
            else:
                consts = [c for c in range(1, 10) if _valid(op, a, c)]
                if not consts:
                    continue
                b = c = self.rng.choice(consts)
                z = None
            name = self.names.pop()
            self.values[name] = _apply(op, a, b)
            self.sentences.append(_sentence(name, op, left, z, c))
            return name, f"{name} = {a} {_SYMBOL[op]} {b} = {self.values[name]}"
        raise _Retry

    def build(self) -> tuple[list[str], list[str], list[list[str]]]:
        """(derived names in order, their reference lines, their derived parents)."""
        derived, lines, parents = [], [], []
        unused: list[str] = []  # derived quantities no later quantity depends on yet
        for k in range(1, self.n + 1):
            remaining = self.n - k
            # each later step can absorb at most one more unused quantity (binary ops), so the last one is
            # the only sink: every derived quantity is then needed for the answer
            options = [c for c in (0, 1, 2) if c <= len(unused) and len(unused) - c <= remaining]
            consumed = self.rng.sample(unused, self.rng.choice(options))
            unused = [u for u in unused if u not in consumed]
            if len(consumed) == 2:
                left, right = consumed if self.rng.random() < 0.5 else consumed[::-1]
            else:
                used = [d for d in derived if d not in unused]
                if consumed:
                    left = consumed[0]
                else:
                    left = self.rng.choice(used) if used and self.rng.random() < 0.5 else self.base()
                right = None if self.rng.random() < 0.5 else self.base()
                if right == left:
                    right = None
            try:
                name, line = self.derive(left, right)
            except _Retry:
                if len(consumed) < 2:
                    raise
                name, line = self.derive(right, left)
            derived.append(name)
            lines.append(line)
            parents.append([p for p in (left, right) if p in derived])
            unused.append(name)
        return derived, lines, parents

    def distractors(self, count: int) -> None:
        for _ in range(count):
            if self.rng.random() < 0.5:
                name = self.names.pop()
                self.values[name] = self.rng.randint(1, 9)
                self.sentences.append(f"There are {self.values[name]} {name}.")
            else:
                self.derive(self.rng.choice(list(self.values)), None)


class ChainEnv(SyntheticEnv):
    name = "chain"

    def generate_row(self, n: int, rng) -> dict[str, Any]:
        if n > MAX_N:
            raise ValueError(f"chain supports n <= {MAX_N} (its name pool has {len(NAMES)} quantities), got {n}")
        while True:
            builder = _Builder(n, rng)
            try:
                derived, lines, parents = builder.build()
                builder.distractors(max(1, n // 2))
                break
            except _Retry:
                continue
        rng.shuffle(builder.sentences)
        target = derived[-1]
        answer = str(builder.values[target])
        user_text = (
            "Answer the question. Write one line per quantity you work out, as `name = calculation = value`, "
            "then the answer as \\boxed{value}.\n"
            + " ".join(builder.sentences)
            + f"\nQuestion: how many {target} are there?"
        )
        reference = "\n".join(lines + [f"\\boxed{{{answer}}}"])
        points = [f"{name} = {builder.values[name]}" for name in derived]
        points[-1] += f"; final answer \\boxed{{{answer}}}"
        index = {name: k for k, name in enumerate(derived, start=1)}
        graph = [{"if_all": [index[name]], "makes_obsolete": sorted(index[p] for p in premises)}
                 for name, premises in zip(derived, parents) if premises]
        task = {"points": derived, "values": {name: builder.values[name] for name in derived}}
        return build_row(self.name, n, user_text, answer, reference, points, graph, task)

    def match_points(self, row: dict[str, Any], text: str) -> set[int]:
        task = load_task(row)
        names, values = task["points"], task["values"]

        def parse_line(line: str):
            match = _LINE.match(line)
            if match is None or match.group(1).lower() not in values:
                return None
            value = _parse_integer(match.group(2).split("=")[-1].rstrip(". "))
            return None if value is None else (match.group(1).lower(), value)

        stated = first_statements(text, parse_line)
        reached = {k for k, name in enumerate(names, start=1) if stated.get(name) == values[name]}
        if self.verify(row, text):
            reached.add(len(names))
        return reached

    def verify(self, row: dict[str, Any], text: str) -> bool:
        return _parse_integer(last_boxed(text)) == int(row["answer"])
