"""Multi-Add: n independent additions in one response — the CPU-sized stand-in for Multi-Countdown (PPM §5.1).

Prompt: the n pairs (`Add: 3+5, 2+7, 4+4`). Reference: each sub-problem restated next to its answer, one line each,
then the sums in a box:

    3+5=8
    2+7=9
    4+4=8
    \\boxed{8,9,8}

Restating the pair makes every line a local lookup-and-add, so a model's accuracy on one sub-problem does not
fall with n (the length-generalisation trap of a bare `8;9;8` answer, which mixes "more" with "harder" problems).

Points: k = 1..n is "line k is `a_k+b_k=s_k`" — positional (line k answers problem k; extra or missing lines shift
everything after them) and only for complete lines (ended by a newline), so a prefix cut inside `7+8=15` does
not collect `7+8=1`. Point n + 1 is the outcome, in a strict format: exactly the n correct lines, then the
`\\boxed{}` line with the n sums, then nothing (trailing whitespace aside). Junk after the box, a missing box or
an extra line fails it: partial credit alone would otherwise pay a policy that never terminates cleanly
(the termination trap). The graph is goal-only: the outcome obsoletes the n sub-problems.
"""

from __future__ import annotations

import re
from typing import Any

from ppm_trl.envs import build_row, load_task
from ppm_trl.envs.base import SyntheticEnv

MAX_OPERAND = 9  # single digits: sums 0..18, lines of 6-7 characters
_LINE = re.compile(r"^\s*(\d{1,6})\s*\+\s*(\d{1,6})\s*=\s*(-?\d{1,12})\s*$", re.ASCII)
_BOX = re.compile(r"^\s*\\boxed\{([^{}]*)\}\s*$", re.ASCII)
_INTEGER = re.compile(r"^\s*-?\d{1,12}\s*$", re.ASCII)
_MAX_LINE_CHARS = 2000  # nothing we generate is this long; bounds the parsers' work on garbage


def _format_line(a: int, b: int) -> str:
    return f"{a}+{b}={a + b}"


def _parse_line(line: str) -> tuple[int, int, int] | None:
    if len(line) > _MAX_LINE_CHARS:
        return None
    match = _LINE.match(line)
    return None if match is None else (int(match.group(1)), int(match.group(2)), int(match.group(3)))


def _parse_box(line: str) -> list[int] | None:
    match = _BOX.match(line) if len(line) <= _MAX_LINE_CHARS else None
    if match is None:
        return None
    parts = match.group(1).split(",")
    if not all(_INTEGER.match(part) for part in parts):
        return None
    return [int(part) for part in parts]


class MultiAddEnv(SyntheticEnv):
    """n independent additions of operands in 0..`max_operand`; points = correct lines + strict final box."""

    name = "multi_add"
    max_operand: int = MAX_OPERAND

    def generate_row(self, n: int, rng) -> dict[str, Any]:
        pairs = [(rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)) for _ in range(n)]
        sums = [a + b for a, b in pairs]
        answer = ",".join(map(str, sums))
        # Short on purpose: every prompt byte is a token the tiny CPU model attends over at every step.
        user_text = "Add: " + ", ".join(f"{a}+{b}" for a, b in pairs)
        lines = [_format_line(a, b) for a, b in pairs]
        reference = "\n".join(lines + [f"\\boxed{{{answer}}}"])
        points = [f"Sub-problem {k}: {line}" for k, line in enumerate(lines, start=1)]
        points.append(f"All {n} sums written and the final answer given: \\boxed{{{answer}}}")
        graph = [{"if_all": [n + 1], "makes_obsolete": list(range(1, n + 1))}]
        return build_row(self.name, n, user_text, answer, reference, points, graph, {"pairs": pairs})

    def solved_lines(self, row: dict[str, Any], text: str) -> set[int]:
        """1-based sub-problems whose line (line k of `text`, complete) restates the pair with the right sum."""
        pairs = _pairs(row)
        complete_lines = text.split("\n")[:-1]  # the piece after the last newline is unfinished
        solved = set()
        for k, ((a, b), line) in enumerate(zip(pairs, complete_lines), start=1):
            if _parse_line(line) == (a, b, a + b):
                solved.add(k)
        return solved

    def match_points(self, row: dict[str, Any], text: str) -> set[int]:
        reached = self.solved_lines(row, text)
        if self.verify(row, text):
            reached.add(len(_pairs(row)) + 1)
        return reached

    def verify(self, row: dict[str, Any], text: str) -> bool:
        """Exactly the n correct lines, then `\\boxed{s_1,...,s_n}`, then only whitespace."""
        pairs = _pairs(row)
        lines = text.strip().split("\n")
        if len(lines) != len(pairs) + 1:
            return False
        if any(_parse_line(line) != (a, b, a + b) for (a, b), line in zip(pairs, lines)):
            return False
        return _parse_box(lines[-1]) == [a + b for a, b in pairs]


def _pairs(row: dict[str, Any]) -> list[tuple[int, int]]:
    pairs = load_task(row).get("pairs")
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"multi_add row has no `pairs` in its task data, got {pairs!r}")
    return [(int(a), int(b)) for a, b in pairs]


__all__ = ["MAX_OPERAND", "MultiAddEnv"]
