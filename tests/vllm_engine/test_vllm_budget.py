"""ARG's continuation requests fit vLLM's context: `plan_generation_calls` (pure; runs without vLLM).

The engine-level test (a tight `vllm_max_model_length`, real vLLM) is in tests/vllm_engine/test_vllm_trainers.py.
"""

from __future__ import annotations

import pytest

from ppm_trl.trainers.base import plan_generation_calls

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

def _served(calls, budgets, rooms):
    """Check each row is in exactly one call that neither exceeds its room nor gives it less than it may get."""
    seen = sorted(i for _, rows in calls for i in rows)
    assert seen == list(range(len(budgets)))
    for max_tokens, rows in calls:
        for i in rows:
            assert rooms[i] is None or max_tokens <= rooms[i]  # never more than max_model_len − len(prompt + prefix)
            wanted = budgets[i] if rooms[i] is None else min(budgets[i], rooms[i])
            assert max_tokens >= wanted  # cut to the budget afterwards: the same distribution


def test_one_call_when_the_context_has_room():
    budgets, rooms = [48, 39, 26], [500, 491, 478]
    assert plan_generation_calls(budgets, rooms) == [(48, [0, 1, 2])]
    assert plan_generation_calls(budgets, [None] * 3) == [(48, [0, 1, 2])]  # HF generate: no limit


def test_tight_context_splits_by_budget():
    # prompt 50, max_completion_length 48, max_model_len 98: prefixes 0, 9, 22 leave exactly their budgets.
    budgets = [48, 39, 26, 39]
    rooms = [98 - 50 - p for p in (0, 9, 22, 9)]
    calls = plan_generation_calls(budgets, rooms)
    assert calls == [(48, [0]), (39, [1, 3]), (26, [2])]
    _served(calls, budgets, rooms)


def test_row_with_less_room_than_budget_is_capped_at_its_room():
    calls = plan_generation_calls([48, 48], [30, 100])
    assert calls == [(48, [1]), (30, [0])]


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_serve_every_row(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(1, 12)
    budgets = [rng.randint(1, 64) for _ in range(n)]
    rooms = [rng.choice([None, rng.randint(1, 80)]) for _ in range(n)]
    _served(plan_generation_calls(budgets, rooms), budgets, rooms)
