"""The one interface trainers use for partial credit.

* PPM progress scorers: given dataset rows and, per completion, the K texts to judge (the prefixes c_1..c_k, or the
  chunks c_k alone for the process-reward baseline), return the (N, K) progress matrix m (NaN = unscorable).
* PAPO process scorers: given rows and the texts of CORRECT responses, return one score per response (None =
  unscorable).

Both come in a programmatic flavour (the synthetic envs' matchers: no LLM) and a judge flavour (LiteLLMJudge).
A point matcher turns (row, text) requests into reached point sets; the scorer owns everything that does not
depend on who judges: skipping empty and unchanged prefixes, de-duplicating requests, graph closure, counting.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from .advantages import exact_order_progress
from .points import ReasoningGraph
from .text import problem_text

Reached = frozenset[int] | None


class PointMatcher(Protocol):
    def __call__(self, requests: Sequence[tuple[dict[str, Any], str]]) -> list[Reached]: ...


def reasoning_graph_of(row: dict[str, Any]) -> ReasoningGraph:
    """The row's obsoletion graph; a row without rules gets the goal-only graph."""
    points = row.get("reasoning_points")
    if not points:
        raise ValueError(f"row has no `reasoning_points`: {str(row.get('prompt'))[:80]!r}")
    return ReasoningGraph.from_records(row.get("reasoning_graph") or [], len(points))


class ProgrammaticPointMatcher:
    """Reached points from the synthetic envs' own matchers (`row["env"]` names the env)."""

    def __call__(self, requests):
        from .envs import get_env

        out = []
        for row, text in requests:
            env_name = row.get("env")
            if env_name is None:
                raise ValueError(
                    "the programmatic scorer needs an `env` column naming a synthetic env; for other datasets use "
                    'the judge scorer (`progress_scorer="judge"` / `process_scorer="judge"`)'
                )
            out.append(frozenset(get_env(env_name).match_points(row, text)))
        return out


class JudgePointMatcher:
    """Reached points graded by an LLM judge with the PPM paper's App. D prompt (None when unparseable)."""

    def __init__(self, judge):
        self.judge = judge

    def __call__(self, requests):
        items = [(problem_text(row), list(row["reasoning_points"]), text) for row, text in requests]
        grades = self.judge.grade_prefixes(items)
        return [None if g is None else frozenset(i + 1 for i, ok in enumerate(g) if ok) for g in grades]


class ProgressScorer:
    """(N, K) progress m_k of each completion's K texts, for the PPM trainer.

    mode `ppm`: texts are prefixes, progress = |closure(reached)|/n (shortcutting per `shortcutting`);
    `exact_order`: texts are prefixes, progress = longest in-order run; `process_reward`: texts are chunks judged
    alone, value = fraction of points the chunk shows, no shortcutting (a per-chunk reward, not a running state).
    An empty text scores as nothing reached without a request; an unchanged prefix reuses the previous result;
    identical (row, text) pairs in one call are sent once.
    """

    def __init__(self, matcher: PointMatcher, mode: str = "ppm", shortcutting: bool = True):
        if mode not in ("ppm", "exact_order", "process_reward"):
            raise ValueError(f"unknown progress mode {mode!r}; accepted: ppm, exact_order, process_reward")
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


def build_judge(args):
    from .judge import LiteLLMJudge
    from .judge.callback import check_unscorable_settings

    # checked here, before the model loads; the stats callback applies them once the trainer exists
    check_unscorable_settings(getattr(args, "judge_max_unscorable_frac", 1.0), getattr(args, "judge_unscorable_window", 1),
                              getattr(args, "judge_unscorable_min_rows", 2), getattr(args, "judge_quarantine_after", 2))
    return LiteLLMJudge(**args.judge_kwargs(args.output_dir))


def build_progress_scorer(args, judge=None) -> ProgressScorer:
    """The progress scorer a `PPMConfig` names (`progress_scorer`: programmatic | judge); `judge`: the judge to ask
    (default: the LiteLLM judge of `args`; `ppm-trl estimate` passes one that records the requests)."""
    if args.progress_scorer == "programmatic":
        return ProgressScorer(ProgrammaticPointMatcher(), mode=args.progress_mode, shortcutting=args.shortcutting)
    judge = build_judge(args) if judge is None else judge
    if args.progress_mode == "process_reward":
        return JudgeProcessRewardScorer(judge)
    return ProgressScorer(JudgePointMatcher(judge), mode=args.progress_mode, shortcutting=args.shortcutting)


def scorer_judge(scorer):
    """The LiteLLMJudge behind a scorer, if any (for the judge-statistics callback)."""
    return getattr(scorer, "judge", None) or getattr(getattr(scorer, "matcher", None), "judge", None)


def build_process_scorer(args, judge=None):
    """The process scorer a `PAPOConfig` names (`process_scorer`: programmatic | judge); `judge` as in
    `build_progress_scorer`."""
    if args.process_scorer == "programmatic":
        return ProgrammaticProcessScorer()
    return JudgeProcessScorer(build_judge(args) if judge is None else judge, rubric=args.rubric)
