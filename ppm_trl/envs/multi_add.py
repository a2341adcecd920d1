"""Multi-Add: n independent additions in one response — the CPU-sized stand-in for Multi-Countdown (PPM §5.1).

Prompt: the n pairs, each under a letter label (`a:3+5`, `b:2+7`, ...). Reference: each sub-problem restated with
its label next to its answer, one line each, then the labelled sums in a box:

    a:3+5=8
    b:2+7=9
    c:4+4=8
    \\boxed{a=8,b=9,c=8}

Restating the pair makes every line a local lookup-and-add, and the unique label makes the lookup a plain
content match, so a small model's accuracy on one sub-problem does not fall with n (the length-generalisation
trap of a bare `8;9;8` answer, which mixes "more" with "harder" sub-problems). Hence n ≤ 26.

Points: k = 1..n is "line k is `<label k>:a_k+b_k=s_k`" — positional (line k answers problem k) and only for
complete lines (ended by a newline), so a prefix cut inside `h:7+8=15` does not collect `h:7+8=1`. Point n + 1 is
the outcome, in a strict format: exactly the n correct lines, then the `\\boxed{}` line with the n labelled sums,
then nothing (trailing whitespace aside). Junk after the box, a missing box or an extra line fails it: partial
credit alone would otherwise pay a policy that never terminates cleanly (the termination trap). The graph is
goal-only: the outcome obsoletes the n sub-problems.
"""

from __future__ import annotations

import re
from typing import Any

from ppm_trl.envs import build_row, load_task
from ppm_trl.envs.base import SyntheticEnv

MAX_OPERAND = 9  # single digits: sums 0..18, lines of 6-7 characters
LABELS = "abcdefghijklmnopqrstuvwxyz"
_LINE = re.compile(r"^\s*([a-z])\s*:\s*(\d{1,6})\s*\+\s*(\d{1,6})\s*=\s*(-?\d{1,12})\s*$", re.ASCII)
_BOX = re.compile(r"^\s*\\boxed\{([^{}]*)\}\s*$", re.ASCII)
_ITEM = re.compile(r"^\s*([a-z])\s*=\s*(-?\d{1,12})\s*$", re.ASCII)
_MAX_LINE_CHARS = 2000  # nothing we generate is this long; bounds the parsers' work on garbage


def _format_line(label: str, a: int, b: int) -> str:
    return f"{label}:{a}+{b}={a + b}"


def _format_answer(sums: list[int]) -> str:
    return ",".join(f"{label}={value}" for label, value in zip(LABELS, sums))


def _parse_line(line: str) -> tuple[str, int, int, int] | None:
    if len(line) > _MAX_LINE_CHARS:
        return None
    match = _LINE.match(line)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3)), int(match.group(4))


def _parse_box(line: str) -> list[tuple[str, int]] | None:
    match = _BOX.match(line) if len(line) <= _MAX_LINE_CHARS else None
    if match is None:
        return None
    items = [_ITEM.match(part) for part in match.group(1).split(",")]
    if not all(items):
        return None
    return [(item.group(1), int(item.group(2))) for item in items]


def _expected_line(k: int, a: int, b: int) -> tuple[str, int, int, int]:
    return LABELS[k], a, b, a + b


class MultiAddEnv(SyntheticEnv):
    """n independent additions of operands in 0..`max_operand`; points = correct lines + strict final box."""

    name = "multi_add"
    max_operand: int = MAX_OPERAND

    def generate_row(self, n: int, rng) -> dict[str, Any]:
        if n > len(LABELS):
            raise ValueError(f"multi_add supports n <= {len(LABELS)} (one letter label per sub-problem), got {n}")
        pairs = [(rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)) for _ in range(n)]
        answer = _format_answer([a + b for a, b in pairs])
        # Short on purpose: every prompt byte is a token the tiny CPU model attends over at every step.
        user_text = "Add:\n" + "\n".join(f"{label}:{a}+{b}" for label, (a, b) in zip(LABELS, pairs))
        lines = [_format_line(label, a, b) for label, (a, b) in zip(LABELS, pairs)]
        reference = "\n".join(lines + [f"\\boxed{{{answer}}}"])
        points = [f"Sub-problem {k}: {line}" for k, line in enumerate(lines, start=1)]
        points.append(f"All {n} sums written and the final answer given: \\boxed{{{answer}}}")
        graph = [{"if_all": [n + 1], "makes_obsolete": list(range(1, n + 1))}]
        return build_row(self.name, n, user_text, answer, reference, points, graph, {"pairs": pairs})

    def solved_lines(self, row: dict[str, Any], text: str) -> set[int]:
        """1-based sub-problems whose line (line k of `text`, complete) restates label and pair with the right sum."""
        pairs = _pairs(row)
        complete_lines = text.split("\n")[:-1]  # the piece after the last newline is unfinished
        return {k + 1 for k, ((a, b), line) in enumerate(zip(pairs, complete_lines))
                if _parse_line(line) == _expected_line(k, a, b)}

    def match_points(self, row: dict[str, Any], text: str) -> set[int]:
        reached = self.solved_lines(row, text)
        if self.verify(row, text):
            reached.add(len(_pairs(row)) + 1)
        return reached

    def verify(self, row: dict[str, Any], text: str) -> bool:
        """Exactly the n correct lines, then `\\boxed{a=s_1,b=s_2,...}`, then only whitespace."""
        pairs = _pairs(row)
        lines = text.strip().split("\n")
        if len(lines) != len(pairs) + 1:
            return False
        if any(_parse_line(line) != _expected_line(k, a, b) for k, ((a, b), line) in enumerate(zip(pairs, lines))):
            return False
        return _parse_box(lines[-1]) == [(LABELS[k], a + b) for k, (a, b) in enumerate(pairs)]


def _pairs(row: dict[str, Any]) -> list[tuple[int, int]]:
    pairs = load_task(row).get("pairs")
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"multi_add row has no `pairs` in its task data, got {pairs!r}")
    return [(int(a), int(b)) for a, b in pairs]


__all__ = ["LABELS", "MAX_OPERAND", "MultiAddEnv"]
