"""PAPO's process scorers: given dataset rows and the texts of CORRECT responses, one score in [0, 1] per response
(None = unscorable) — the fraction of reference points a response shows (programmatic, no LLM) or the rubric
judge's grade (PAPO A.3). `build_process_scorer` builds the one a `PAPOConfig` names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..judge.arguments import build_judge
from ..scorers import ProgrammaticPointMatcher, reasoning_graph_of
from ..text import problem_text


class ProgrammaticProcessScorer:
    """PAPO process score without an LLM: the fraction of reference points a (correct) response shows, no shortcut."""

    def __init__(self):
        self.matcher = ProgrammaticPointMatcher()
        self.stats = Counter()

    def __call__(self, rows: Sequence[dict[str, Any]], texts: Sequence[str]) -> list[float | None]:
        reached = self.matcher(list(zip(rows, texts)))
        self.stats["requests"] += len(texts)
        return [reasoning_graph_of(row).progress(r, shortcut=False) for row, r in zip(rows, reached)]


class JudgeProcessScorer:
    """PAPO process score from the rubric judge (PAPO A.3 prompt, last `\\boxed{}` in the tier's allowed set)."""

    def __init__(self, judge, rubric: str = "three_tier"):
        self.judge = judge
        self.rubric = rubric
        self.stats = Counter()

    def __call__(self, rows, texts):
        items = [(problem_text(row), row["reference"], text) for row, text in zip(rows, texts)]
        scores = self.judge.score_rubric(items, tier=self.rubric)
        self.stats["requests"] += len(items)
        self.stats["failures"] += sum(s is None for s in scores)
        return scores


def _programmatic_process_scorer(args, judge=None) -> ProgrammaticProcessScorer:
    return ProgrammaticProcessScorer()


def _judge_process_scorer(args, judge=None) -> JudgeProcessScorer:
    return JudgeProcessScorer(build_judge(args) if judge is None else judge, rubric=args.rubric)


# `PAPOConfig.process_scorer` → (config, judge or None) → scorer; the config accepts exactly these keys.
PROCESS_SCORERS = {"programmatic": _programmatic_process_scorer, "judge": _judge_process_scorer}


def build_process_scorer(args, judge=None):
    """The process scorer a `PAPOConfig` names (`process_scorer`: a key of `PROCESS_SCORERS`); `judge` as in
    `build_progress_scorer`."""
    return PROCESS_SCORERS[args.process_scorer](args, judge)
