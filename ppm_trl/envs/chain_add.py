"""Chain-Add: n additions mod 10 where each one starts from the previous result — the sequential counterpart of
`multi_add` (the CPU-sized stand-in for the paper's sequential tasks, Matrix / GSM-Infinite, §5.1-5.2).

Prompt: a start value `s` and n labelled addends. Reference: one line per step, restating the addend, the
running value and the new value (mod 10 keeps every number one digit, so per-step difficulty does not grow with
n), then the final value in a box. With `s:3`, `a:5`, `b:4`, `c:7`:

    a:5+3=8
    b:4+8=2
    c:7+2=9
    \\boxed{9}

Every line looks up one addend by its label (as in `multi_add`) and carries the previous line's value, so an
error propagates: the reasoning graph is a chain, point k makes points 1..k-1 obsolete (App. A's sequential
graph). The addend comes first because "copy what follows `c:` in the prompt" is the first thing a small model
learns; with the running value first, SFT of the tiny model did not get line 1 right in 1,500 steps. Points:
k = 1..n is "line k is `<label k>:d_k+v_{k-1}=v_k`" with the true running values, positional and only for
complete lines; point n + 1 is the outcome in the strict format of `multi_add` (exactly the n correct lines,
then `\\boxed{v_n}`, then nothing).
"""

from __future__ import annotations

from typing import Any

from ppm_trl.envs import build_row, load_task
from ppm_trl.envs.base import SyntheticEnv
from ppm_trl.envs.multi_add import _BOX, LABELS, _parse_line

MODULUS = 10


def running_values(start: int, addends: list[int]) -> list[int]:
    """v_0 = start, v_k = (v_{k-1} + d_k) mod 10: the values after each step (v_1..v_n)."""
    values, value = [], start
    for addend in addends:
        value = (value + addend) % MODULUS
        values.append(value)
    return values


def _expected_lines(start: int, addends: list[int]) -> list[tuple[str, int, int, int]]:
    values = running_values(start, addends)
    previous = [start] + values[:-1]
    return [(LABELS[k], addends[k], previous[k], values[k]) for k in range(len(addends))]


class ChainAddEnv(SyntheticEnv):
    """n chained additions mod 10; points = correct lines (a chain graph) + strict final box."""

    name = "chain_add"

    def generate_row(self, n: int, rng) -> dict[str, Any]:
        if n > len(LABELS):
            raise ValueError(f"chain_add supports n <= {len(LABELS)} (one letter label per step), got {n}")
        start = rng.randint(0, MODULUS - 1)
        addends = [rng.randint(0, MODULUS - 1) for _ in range(n)]
        expected = _expected_lines(start, addends)
        final = expected[-1][3]
        user_text = f"Chain mod {MODULUS}:\ns:{start}\n" + "\n".join(
            f"{label}:{d}" for label, d in zip(LABELS, addends))
        lines = [f"{label}:{a}+{b}={v}" for label, a, b, v in expected]
        reference = "\n".join(lines + [f"\\boxed{{{final}}}"])
        points = [f"Step {k}: {line}" for k, line in enumerate(lines, start=1)]
        points.append(f"All {n} steps written and the final value given: \\boxed{{{final}}}")
        # Point k needs every earlier value: reaching it makes 1..k-1 obsolete (App. A, sequential graph).
        graph = [{"if_all": [k], "makes_obsolete": list(range(1, k))} for k in range(2, n + 2)]
        return build_row(self.name, n, user_text, str(final), reference, points, graph,
                         {"start": start, "addends": addends})

    def solved_lines(self, row: dict[str, Any], text: str) -> set[int]:
        """1-based steps whose line (line k of `text`, complete) is exactly right, running value included."""
        complete_lines = text.split("\n")[:-1]  # the piece after the last newline is unfinished
        expected = _expected_lines(*_task(row))
        return {k + 1 for k, (want, line) in enumerate(zip(expected, complete_lines)) if _parse_line(line) == want}

    def match_points(self, row: dict[str, Any], text: str) -> set[int]:
        reached = self.solved_lines(row, text)
        if self.verify(row, text):
            reached.add(len(_task(row)[1]) + 1)
        return reached

    def verify(self, row: dict[str, Any], text: str) -> bool:
        """Exactly the n correct lines, then `\\boxed{v_n}`, then only whitespace."""
        expected = _expected_lines(*_task(row))
        lines = text.strip().split("\n")
        if len(lines) != len(expected) + 1 or len(lines[-1]) > 100:
            return False
        if any(_parse_line(line) != want for want, line in zip(expected, lines)):
            return False
        box = _BOX.match(lines[-1])
        return box is not None and box.group(1).strip() == str(expected[-1][3])


def _task(row: dict[str, Any]) -> tuple[int, list[int]]:
    task = load_task(row)
    start, addends = task.get("start"), task.get("addends")
    if not isinstance(start, int) or not isinstance(addends, list) or not addends:
        raise ValueError(f"chain_add row needs `start` (int) and `addends` (non-empty list) in its task data, "
                         f"got {task!r}")
    return start, [int(d) for d in addends]


__all__ = ["ChainAddEnv", "MODULUS", "running_values"]
