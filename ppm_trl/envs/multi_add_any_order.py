"""Multi-Add in any order: `multi_add` whose n lines may come in any order — many distinct correct trajectories.

On `multi_add` the one correct answer is one fixed text, so every correct continuation of a reference prefix is a
byte copy of the reference: ARG's feedback W (eq. 7) is 0 for all of them and ARG reduces to reference insertion.
Here each reference lists the lines in its own random order (so a warm start trained on the references learns
varied orders), and any order is correct: a continuation that finishes the remaining lines in another order than
the reference's is a *different* correct trajectory, which is what ARG's successful replacement d_t counts.

    c:4+4=8
    a:3+5=8
    b:2+7=9
    \\boxed{a=8,b=9,c=8}

Points: k = 1..n is "the line of label k (`<label k>:a_k+b_k=s_k`) is written, complete, anywhere"; n + 1 is the
outcome: exactly n lines, each label once, all right, then the box in label order, then nothing. Goal-only graph.
"""

from __future__ import annotations

from typing import Any

from ppm_trl.envs import build_row
from ppm_trl.envs.multi_add import LABELS, MultiAddEnv, _format_answer, _format_line, _pairs, _parse_box, _parse_line


class MultiAddAnyOrderEnv(MultiAddEnv):
    """`multi_add` whose lines may come in any order (references shuffled per row)."""

    name = "multi_add_any_order"

    def generate_row(self, n: int, rng) -> dict[str, Any]:
        row = super().generate_row(n, rng)  # the pairs and prompt as multi_add draws them
        pairs = [(int(a), int(b)) for a, b in _pairs(row)]
        order = list(range(n))
        rng.shuffle(order)
        lines = [_format_line(LABELS[k], *pairs[k]) for k in order]
        answer = _format_answer([a + b for a, b in pairs])
        reference = "\n".join(lines + [f"\\boxed{{{answer}}}"])
        points = [f"Sub-problem {k + 1}: {_format_line(LABELS[k], *pairs[k])} (any position)" for k in range(n)]
        points.append(f"All {n} sums written and the final answer given: \\boxed{{{answer}}}")
        graph = [{"if_all": [n + 1], "makes_obsolete": list(range(1, n + 1))}]
        user_text = row["prompt"][0]["content"] if isinstance(row["prompt"], list) else row["prompt"]
        return build_row(self.name, n, user_text, answer, reference, points, graph, {"pairs": pairs})

    def solved_lines(self, row: dict[str, Any], text: str) -> set[int]:
        """1-based sub-problems whose line (label, pair, right sum) is a complete line of `text`, at any position."""
        pairs = _pairs(row)
        solved = set()
        for line in text.split("\n")[:-1]:  # the piece after the last newline is unfinished
            parsed = _parse_line(line)
            if parsed is None or parsed[0] not in LABELS[: len(pairs)]:
                continue
            k = LABELS.index(parsed[0])
            a, b = pairs[k]
            if parsed == (LABELS[k], a, b, a + b):
                solved.add(k + 1)
        return solved

    def verify(self, row: dict[str, Any], text: str) -> bool:
        """n lines with each label exactly once, all right (any order), then `\\boxed{a=s_1,b=s_2,...}`, then only
        whitespace."""
        pairs = _pairs(row)
        lines = text.strip().split("\n")
        if len(lines) != len(pairs) + 1:
            return False
        parsed = [_parse_line(line) for line in lines[:-1]]
        if any(p is None for p in parsed) or sorted(p[0] for p in parsed) != list(LABELS[: len(pairs)]):
            return False
        if any(p != (p[0], *pairs[LABELS.index(p[0])], sum(pairs[LABELS.index(p[0])])) for p in parsed):
            return False
        return _parse_box(lines[-1]) == [(LABELS[k], a + b) for k, (a, b) in enumerate(pairs)]


__all__ = ["MultiAddAnyOrderEnv"]
