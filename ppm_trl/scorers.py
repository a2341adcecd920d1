"""The one interface trainers use for partial credit, and what its scorers share.

* PPM progress scorers (`ppm_trl/ppm/progress_scorers.py`): given dataset rows and, per completion, the K texts to
  judge (the prefixes c_1..c_k, or the chunks c_k alone for the process-reward baseline), return the (N, K)
  progress matrix m (NaN = unscorable).
* PAPO process scorers (`ppm_trl/papo/process_scorers.py`): given rows and the texts of CORRECT responses, return
  one score per response (None = unscorable).

Both come in a programmatic flavour (the synthetic envs' matchers: no LLM) and a judge flavour (LiteLLMJudge).
A point matcher (here) turns (row, text) requests into reached point sets; the scorer owns everything that does not
depend on who judges: skipping empty and unchanged prefixes, de-duplicating requests, graph closure, counting.
The scorers keep their names here too (imported on first use: the method folders import this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

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


def scorer_judge(scorer):
    """The LiteLLMJudge behind a scorer, if any (for the judge-statistics callback)."""
    return getattr(scorer, "judge", None) or getattr(getattr(scorer, "matcher", None), "judge", None)
