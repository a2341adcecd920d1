"""Multi-Add judged on the box: `multi_add` whose outcome is the boxed sums alone, so correct answers differ in process.

On `multi_add` a correct answer has every line right (the outcome checks the lines), so every correct answer has the
same process score and PAPO's A_proc is 0 by construction. Here the outcome is the final answer, as in a math task
graded on its `\\boxed{}`: n work lines, each restating its label and operands (`c:4+4=`) with *some* sum, then the box
with the true sums, then nothing. A line may state a wrong sum and the answer still be correct — a right answer with
flawed work, the case PAPO's process advantage is for (PAPO §1: 'correct answers, unsound reasoning').

    a:3+5=8
    b:2+7=10        <- wrong work line
    \\boxed{a=8,b=9}  <- correct outcome

Points: k = 1..n is "line k states the right sum" (as in `multi_add`); n + 1 is the outcome. The programmatic process
score of a correct answer is then (right lines + 1) / (n + 1).
"""

from __future__ import annotations

from typing import Any

from ppm_trl.envs.multi_add import LABELS, MultiAddEnv, _pairs, _parse_box, _parse_line


class MultiAddBoxedEnv(MultiAddEnv):
    """`multi_add` whose outcome checks the box (true sums) and only the form of the work lines."""

    name = "multi_add_boxed"

    def verify(self, row: dict[str, Any], text: str) -> bool:
        """Exactly n lines `<label k>:a_k+b_k=<any integer>`, then `\\boxed{a=s_1,b=s_2,...}` with the true sums, then
        only whitespace."""
        pairs = _pairs(row)
        lines = text.strip().split("\n")
        if len(lines) != len(pairs) + 1:
            return False
        for k, ((a, b), line) in enumerate(zip(pairs, lines)):
            parsed = _parse_line(line)
            if parsed is None or parsed[:3] != (LABELS[k], a, b):
                return False
        return _parse_box(lines[-1]) == [(LABELS[k], a + b) for k, (a, b) in enumerate(pairs)]


__all__ = ["MultiAddBoxedEnv"]
