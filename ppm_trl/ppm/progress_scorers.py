"""PPM's progress scorers: given dataset rows and, per completion, the K texts to judge (the prefixes c_1..c_k, or
the chunks c_k alone for the process-reward baseline), the (N, K) progress matrix m (NaN = unscorable).

A point matcher (`ppm_trl.scorers`: the synthetic envs' matchers, or the LLM judge) turns (row, text) requests into
reached point sets; the scorer owns everything that does not depend on who judges: skipping empty and unchanged
prefixes, de-duplicating requests, graph closure, counting. `build_progress_scorer` builds the one a `PPMConfig`
names.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from ..judge.arguments import build_judge
from ..points import ReasoningGraph
from ..scorers import JudgePointMatcher, PointMatcher, ProgrammaticPointMatcher, reasoning_graph_of
from ..text import problem_text
from .ppm_estimators import accepted_progress_modes, exact_order_progress


class ProgressScorer:
    """(N, K) progress m_k of each completion's K texts, for the PPM trainer.

    mode `ppm`: texts are prefixes, progress = |closure(reached)|/n (shortcutting per `shortcutting`);
    `exact_order`: texts are prefixes, progress = longest in-order run; `process_reward`: texts are chunks judged
    alone, value = fraction of points the chunk shows, no shortcutting (a per-chunk reward, not a running state).
    An empty text scores as nothing reached without a request; an unchanged prefix reuses the previous result;
    identical (row, text) pairs in one call are sent once.
    """

    def __init__(self, matcher: PointMatcher, mode: str = "ppm", shortcutting: bool = True):
        if mode not in accepted_progress_modes():
            raise ValueError(f"unknown progress mode {mode!r}; accepted: {', '.join(accepted_progress_modes())}")
        self.matcher = matcher
        self.mode = mode
        self.shortcutting = shortcutting and mode == "ppm"
        self.stats = Counter()

    def __call__(self, rows: Sequence[dict[str, Any]], texts: Sequence[Sequence[str]]) -> torch.Tensor:
        if len(rows) != len(texts):
            raise ValueError(f"{len(rows)} rows but {len(texts)} lists of segment texts")
        graphs = [reasoning_graph_of(row) for row in rows]
        keys: dict[tuple[int, str], int] = {}
        requests: list[tuple[dict[str, Any], str]] = []
        plan: list[list[int | None]] = []
        for row, row_texts in zip(rows, texts):
            row_plan, previous = [], None
            for text in row_texts:
                if not text.strip():
                    row_plan.append(None)
                    self.stats["skipped_empty"] += 1
                    continue
                if self.mode != "process_reward" and text == previous:
                    row_plan.append(row_plan[-1])
                    self.stats["skipped_unchanged"] += 1
                    continue
                key = (id(row), text)
                if key not in keys:
                    keys[key] = len(requests)
                    requests.append((row, text))
                else:
                    self.stats["deduplicated"] += 1
                row_plan.append(keys[key])
                previous = text
            plan.append(row_plan)
        results = self.matcher(requests) if requests else []
        if len(results) != len(requests):
            raise ValueError(f"point matcher returned {len(results)} results for {len(requests)} requests")
        self.stats["requests"] += len(requests)
        self.stats["failures"] += sum(r is None for r in results)

        width = len(texts[0]) if texts else 0
        progress = torch.full((len(rows), width), math.nan, dtype=torch.float64)
        for i, (graph, row_plan) in enumerate(zip(graphs, plan)):
            for k, index in enumerate(row_plan):
                reached = frozenset() if index is None else results[index]
                if reached is None:
                    continue  # unscorable: stays NaN
                progress[i, k] = self._value(graph, reached)
        return progress

    def _value(self, graph: ReasoningGraph, reached: frozenset[int]) -> float:
        if self.mode == "exact_order":
            mask = torch.zeros(1, 1, graph.num_points, dtype=torch.bool)
            mask[0, 0, [p - 1 for p in reached]] = True
            return float(exact_order_progress(mask, graph.num_points))
        return graph.progress(reached, shortcut=self.shortcutting)


class JudgeProcessRewardScorer:
    """Process-reward baseline with a judge (PPM App. B.1/D): each chunk c_k is judged ALONE for correctness by the
    App. D process prompt; the (N, K) value is 1 (correct) / 0 (incorrect) / NaN (unreadable), empty chunks 0."""

    def __init__(self, judge):
        self.judge = judge
        self.stats = Counter()

    def __call__(self, rows, texts):
        requests, where = [], []
        for i, (row, row_texts) in enumerate(zip(rows, texts)):
            for k, text in enumerate(row_texts):
                if text.strip():
                    requests.append((problem_text(row), [text]))
                    where.append((i, k))
                else:
                    self.stats["skipped_empty"] += 1
        verdicts = self.judge.review_process(requests) if requests else []
        self.stats["requests"] += len(requests)
        self.stats["failures"] += sum(v is None for v in verdicts)
        values = torch.zeros(len(rows), len(texts[0]) if texts else 0, dtype=torch.float64)
        for (i, k), verdict in zip(where, verdicts):
            values[i, k] = math.nan if verdict is None else float(verdict)
        return values


def _programmatic_progress_scorer(args, judge=None) -> ProgressScorer:
    return ProgressScorer(ProgrammaticPointMatcher(), mode=args.progress_mode, shortcutting=args.shortcutting)


def _judge_progress_scorer(args, judge=None):
    judge = build_judge(args) if judge is None else judge
    if args.progress_mode == "process_reward":
        return JudgeProcessRewardScorer(judge)
    return ProgressScorer(JudgePointMatcher(judge), mode=args.progress_mode, shortcutting=args.shortcutting)


# `PPMConfig.progress_scorer` → (config, judge or None) → scorer; the config accepts exactly these keys.
PROGRESS_SCORERS = {"programmatic": _programmatic_progress_scorer, "judge": _judge_progress_scorer}


def build_progress_scorer(args, judge=None):
    """The progress scorer a `PPMConfig` names (`progress_scorer`: a key of `PROGRESS_SCORERS`); `judge`: the judge
    to ask (default: the LiteLLM judge of `args`; `ppm-trl estimate` passes one that records the requests)."""
    return PROGRESS_SCORERS[args.progress_scorer](args, judge)
