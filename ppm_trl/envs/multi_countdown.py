"""Multi-Countdown (paper §5.1, App. C): n independent 4-number Countdown problems in one response.

Line format (one line per problem, then the final answer):

    P1: (3+5)*2-4 = 12
    P2: 8*3-2-1 = 21
    \\boxed{12, 21}

Points: k = 1..n is "problem k solved": the FIRST well-formed `Pk: <expression> = <integer>` line (ended by a
newline, its expression parses) uses each of problem k's numbers exactly once (+ - * / and parentheses; exact rational
arithmetic), evaluates to the target and states it. Point n + 1 is the final answer: every problem solved and
the last `\\boxed{}` lists the targets in order. The outcome (`verify`) is point n + 1. The points are
independent (the paper's best-case SNR), so only the goal obsoletes the rest. Expressions are parsed by a small
recursive-descent parser, never `eval`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from ppm_trl.envs import build_row, first_statements, load_task
from ppm_trl.envs.base import SyntheticEnv
from ppm_trl.text import last_boxed

NUMBERS_PER_PROBLEM = 4
MAX_NUMBER = 9  # single digits keep expressions short for small models
MAX_TARGET = 100
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3
_MAX_DEPTH = 32
_LINE = re.compile(r"^\s*P(\d{1,4})\s*:\s*([^=]*?)\s*=\s*(-?\d{1,12})\s*\.?\s*$", re.ASCII)
_TOKEN = re.compile(r"\s*(\d{1,12}|[-+*/()×÷])", re.ASCII)
_OPERATOR_ALIASES = {"×": "*", "÷": "/"}


def evaluate(expression: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, integers used) of an arithmetic expression, or None if malformed or dividing by zero."""
    tokens = _tokenize(expression)
    if not tokens:
        return None
    parser = _Parser(tokens)
    try:
        value = parser.expression(0)
    except (ValueError, ZeroDivisionError):
        return None
    if parser.pos != len(tokens):
        return None
    return value, parser.numbers


def _tokenize(expression: str) -> list[str] | None:
    tokens, pos = [], 0
    expression = expression.rstrip()
    while pos < len(expression):
        match = _TOKEN.match(expression, pos)
        if match is None:
            return None
        tokens.append(_OPERATOR_ALIASES.get(match.group(1), match.group(1)))
        pos = match.end()
    return tokens


class _Parser:
    """expression := term (('+'|'-') term)*;  term := factor (('*'|'/') factor)*;  factor := INT | '(' expression ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.numbers = tokens, 0, []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expression(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            right = self.term(depth)
            value = value + right if op == "+" else value - right
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self._peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            right = self.factor(depth)
            value = value * right if op == "*" else value / right
        return value

    def factor(self, depth: int) -> Fraction:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end")
        self.pos += 1
        if token == "(":
            if depth >= _MAX_DEPTH:
                raise ValueError("nested too deeply")
            value = self.expression(depth + 1)
            if self._peek() != ")":
                raise ValueError("unclosed parenthesis")
            self.pos += 1
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise ValueError(f"unexpected {token!r}")


def _combine(left: tuple[Fraction, str, int], op: str, right: tuple[Fraction, str, int]) -> tuple[Fraction, str, int]:
    """Apply `op`, printing the fewest parentheses that keep the value (a-(b-c), a/(b*c) keep theirs)."""
    (a, a_text, a_prec), (b, b_text, b_prec) = left, right
    prec = _PRECEDENCE[op]
    if a_prec < prec:
        a_text = f"({a_text})"
    if b_prec < prec or (b_prec == prec and op in "-/"):
        b_text = f"({b_text})"
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
    return value, f"{a_text}{op}{b_text}", prec


def _random_solution(numbers: list[int], rng) -> tuple[int, str] | None:
    """Combine random pairs with random operators (every tree shape is reachable); positive integer steps only."""
    items = [(Fraction(x), str(x), _ATOM) for x in numbers]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        value, text, prec = _combine(items[i], rng.choice("+-*/"), items[j])
        if value is None or value <= 0 or value.denominator != 1:
            return None
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(value, text, prec)]
    value, text, _ = items[0]
    return (int(value), text) if value <= MAX_TARGET else None


def _format_targets(targets: list[int]) -> str:
    return ", ".join(str(t) for t in targets)


def _parse_targets(text: str | None) -> list[int] | None:
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(r"-?\d{1,12}", part, re.ASCII) for part in parts):
        return None
    return [int(part) for part in parts]


class MultiCountdownEnv(SyntheticEnv):
    name = "multi_countdown"

    def generate_row(self, n: int, rng) -> dict[str, Any]:
        problems = []
        while len(problems) < n:
            numbers = [rng.randint(1, MAX_NUMBER) for _ in range(NUMBERS_PER_PROBLEM)]
            solution = _random_solution(numbers, rng)
            if solution is not None:
                problems.append({"numbers": numbers, "target": solution[0], "solution": solution[1]})
        targets = [p["target"] for p in problems]
        answer = _format_targets(targets)
        user_text = (
            f"Solve {n} Countdown problem{'s' if n > 1 else ''}. For each, combine its four numbers with + - * / "
            "and parentheses, using every number exactly once, to reach the target. Write one line per problem, "
            "`Pk: <expression> = <target>`, then the targets as \\boxed{t1, t2, ...}.\n"
            + "\n".join(
                f"Problem {k}: numbers {' '.join(map(str, p['numbers']))}, target {p['target']}"
                for k, p in enumerate(problems, start=1)
            )
        )
        lines = [f"P{k}: {p['solution']} = {p['target']}" for k, p in enumerate(problems, start=1)]
        reference = "\n".join(lines + [f"\\boxed{{{answer}}}"])
        points = [
            f"Problem {k} solved: {' '.join(map(str, p['numbers']))} reach {p['target']}, e.g. {line}"
            for k, (p, line) in enumerate(zip(problems, lines), start=1)
        ]
        points.append(f"All {n} problems solved and the final answer given: \\boxed{{{answer}}}")
        graph = [{"if_all": [n + 1], "makes_obsolete": list(range(1, n + 1))}]
        task = {"problems": [{"numbers": p["numbers"], "target": p["target"]} for p in problems]}
        return build_row(self.name, n, user_text, answer, reference, points, graph, task)

    def _solved(self, problems: list[dict[str, Any]], text: str) -> set[int]:
        def parse_line(line: str):
            match = _LINE.match(line)
            result = None if match is None else evaluate(match.group(2))
            return None if result is None else (int(match.group(1)), (result, int(match.group(3))))

        solved = set()
        for k, ((value, numbers), stated) in first_statements(text, parse_line).items():
            if 1 <= k <= len(problems):
                target = problems[k - 1]["target"]
                if stated == target and value == target and sorted(numbers) == sorted(problems[k - 1]["numbers"]):
                    solved.add(k)
        return solved

    def match_points(self, row: dict[str, Any], text: str) -> set[int]:
        problems = load_task(row)["problems"]
        reached = self._solved(problems, text)
        if len(reached) == len(problems) and _parse_targets(last_boxed(text)) == [p["target"] for p in problems]:
            reached.add(len(problems) + 1)
        return reached

    def verify(self, row: dict[str, Any], text: str) -> bool:
        return len(load_task(row)["problems"]) + 1 in self.match_points(row, text)
