"""ProgressScorer: closure, baselines, skipping empty/unchanged prefixes, de-duplication, NaN for failures."""

from __future__ import annotations

import math

import pytest
import torch

from ppm_trl.ppm.progress_scorers import JudgeProcessRewardScorer, ProgressScorer

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

ROW = {"prompt": "p", "reasoning_points": ["a", "b", "c", "d"],
       "reasoning_graph": [{"if_all": [2], "makes_obsolete": [1]}, {"if_all": [3], "makes_obsolete": [2]}]}


class FakeMatcher:
    """Reached points = the letters present in the text; 'FAIL' → unscorable."""

    def __init__(self):
        self.requests = []

    def __call__(self, requests):
        self.requests.extend(text for _, text in requests)
        return [None if "FAIL" in text else frozenset(i + 1 for i, ch in enumerate("abcd") if ch in text)
                for _, text in requests]


def test_ppm_progress_with_closure_and_skips():
    matcher = FakeMatcher()
    scorer = ProgressScorer(matcher, mode="ppm", shortcutting=True)
    texts = [["c", "c", "c d", "c d"], ["", "", "b", "FAIL"], ["c", "c", "c", "c"]]
    progress = scorer([ROW, ROW, ROW], texts)
    # "c" reaches 3 → obsoletes 2 → obsoletes 1: 3/4. "c d": goal → 1. "b" → {1, 2}: 2/4.
    expected = torch.tensor([[0.75, 0.75, 1, 1], [0, 0, 0.5, math.nan], [0.75, 0.75, 0.75, 0.75]], dtype=torch.float64)
    assert torch.allclose(progress, expected, equal_nan=True)
    # Requests: row0 "c", "c d" (unchanged prefixes skipped); row1 "b", "FAIL"; row 2 is the same row dict as
    # row 0, so its (row, "c") request is de-duplicated → 4 requests in all.
    assert matcher.requests == ["c", "c d", "b", "FAIL"]
    assert scorer.stats["skipped_empty"] == 2 and scorer.stats["skipped_unchanged"] == 5
    assert scorer.stats["deduplicated"] == 1 and scorer.stats["failures"] == 1


def test_baselines():
    exact = ProgressScorer(FakeMatcher(), mode="exact_order")
    assert exact.shortcutting is False
    # "a c": in-order run is just point 1 → 1/4; "a b c" → 3/4; "d" alone → 0 (no goal shortcut in this baseline)
    assert exact([ROW], [["a c", "a b c", "d", "d"]]).tolist() == [[0.25, 0.75, 0.0, 0.0]]
    process = ProgressScorer(FakeMatcher(), mode="process_reward")
    # each chunk alone, no shortcutting, no skipping of equal chunks: "c" → 1/4 (not 3/4)
    assert process([ROW], [["c", "c", "", "a b"]]).tolist() == [[0.25, 0.25, 0.0, 0.5]]


def test_judge_process_reward_scorer_judges_each_chunk_alone():
    class FakeJudge:
        def __init__(self):
            self.items = []

        def review_process(self, items):
            self.items.extend(items)
            return [None if parts[0] == "?" else parts[0] == "ok" for _, parts in items]

    judge = FakeJudge()
    values = JudgeProcessRewardScorer(judge)([ROW], [["ok", "bad", "", "?"]])
    assert torch.allclose(values, torch.tensor([[1.0, 0.0, 0.0, math.nan]], dtype=torch.float64), equal_nan=True)
    assert [parts for _, parts in judge.items] == [["ok"], ["bad"], ["?"]]  # the empty chunk costs no call


def test_bad_mode_and_missing_points():
    with pytest.raises(ValueError, match="progress mode"):
        ProgressScorer(FakeMatcher(), mode="reward_to_go")
    with pytest.raises(ValueError, match="reasoning_points"):
        ProgressScorer(FakeMatcher())([{"prompt": "p"}], [["a"]])
