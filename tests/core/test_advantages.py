"""Advantage estimators: GRPO group normalisation, PPM segment/trajectory advantages and baselines, PAPO.

Every expected number is worked out by hand in the comments (group size 4 unless stated).
"""

from __future__ import annotations

import math

import pytest
import torch

from ppm_trl.advantages import group_normalize, sparse_outcome_advantages, zero_advantage_groups
from ppm_trl.papo.papo_estimators import papo_advantages, papo_components, papo_group_stats
from ppm_trl.ppm.ppm_estimators import (
    exact_order_progress,
    ppm_estimator,
    ppm_segment_advantages,
    ppm_segment_rewards,
    ppm_trajectory_advantages,
    process_reward_advantages,
)

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

NAN = float("nan")


def close(actual, expected, tol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=0), f"\n{actual}\n!=\n{expected}"


# ------------------------------------------------------------------------------------------ group_normalize
def test_group_normalize_sample_std_and_eps():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    # Group 1: mean .25, deviations [.75, -.25, -.25, -.25], sample var (.5625 + 3·.0625)/3 = .25, std .5.
    # Group 2: all equal → 0.
    s = 0.5 + 1e-4
    close(group_normalize(rewards, 4), [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s, 0, 0, 0, 0])
    close(group_normalize(rewards, 4, scale=False), [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])


def test_group_normalize_ignores_nan_and_handles_columns():
    rewards = torch.tensor([[1.0, 2.0], [NAN, 2.0], [0.0, 4.0], [0.0, 0.0]])
    out = group_normalize(rewards, 4, eps=0.0)
    # Column 0 without the NaN: [1, 0, 0], mean 1/3, deviations [2/3, -1/3, -1/3], var (4/9+1/9+1/9)/2 = 1/3.
    std0 = math.sqrt(1 / 3)
    # Column 1: [2, 2, 4, 0], mean 2, deviations [0, 0, 2, -2], var 8/3.
    std1 = math.sqrt(8 / 3)
    close(out, [[2 / 3 / std0, 0], [0, 0], [-1 / 3 / std0, 2 / std1], [-1 / 3 / std0, -2 / std1]])


def test_group_normalize_single_present_entry_and_dtypes():
    out = group_normalize(torch.tensor([NAN, 3.0, NAN, NAN], dtype=torch.float64), 4)
    assert out.dtype == torch.float64 and out.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert group_normalize(torch.tensor([1, 0]), 2).dtype == torch.float32
    with pytest.raises(ValueError, match="group_size=4"):
        group_normalize(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="inf"):
        group_normalize(torch.tensor([1.0, float("inf")]), 2)


def test_sparse_outcome_and_zero_groups():
    adv = sparse_outcome_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2, scale=False)
    close(adv, [0.0, 0.0, -0.5, 0.5])
    assert zero_advantage_groups(adv, 2).tolist() == [True, False]


# ---------------------------------------------------------------------------------------- PPM segment level
# One group of 4 completions, K = 4. Row 2 is non-monotone (0.5 → 0.25); row 3 is short: segments 3, 4 empty,
# with junk (0.3, NaN) there that must be ignored.
PROGRESS = torch.tensor([
    [0.25, 0.5, 0.75, 1.0],
    [0.25, 0.25, 0.5, 0.5],
    [0.5, 0.25, 0.5, 0.75],
    [0.5, 1.0, 0.3, NAN],
])
OUTCOME = torch.tensor([1.0, 0.0, 0.0, 1.0])
VALID = torch.tensor([[True] * 4, [True] * 4, [True] * 4, [True, True, False, False]])
# m after cummax:      row 2 → [.5, .5, .5, .75];  row 3 → [.5, 1, 1, 1] (empty segments carry m over)
# r_k = m_k − m_{k−1}: row 0 [.25,.25,.25,.25]; row 1 [.25,0,.25,0]; row 2 [.5,0,0,.25]; row 3 [.5,.5,0,0]
REWARDS_NO_OUTCOME = [[0.25, 0.25, 0.25, 0.25], [0.25, 0, 0.25, 0], [0.5, 0, 0, 0.25], [0.5, 0.5, 0, 0]]


def test_segment_rewards_monotone_and_empty_segments():
    close(ppm_segment_rewards(PROGRESS, add_outcome=False, valid=VALID), REWARDS_NO_OUTCOME)
    # Outcome added to every valid segment, not to the empty ones: row 0 → 1.25 each, row 3 → [1.5, 1.5, 0, 0].
    close(ppm_segment_rewards(PROGRESS, OUTCOME, valid=VALID),
          [[1.25] * 4, [0.25, 0, 0.25, 0], [0.5, 0, 0, 0.25], [1.5, 1.5, 0, 0]])


def test_segment_advantages_without_outcome_or_std():
    # Segment means: k1 (.25+.25+.5+.5)/4 = .375; k2 (.25+0+0+.5)/4 = .1875; k3 (.25+.25+0+0)/4 = .125; k4 = .125.
    adv = ppm_segment_advantages(PROGRESS, OUTCOME, 4, add_outcome=False, valid=VALID)
    close(adv, [
        [-0.125, 0.0625, 0.125, 0.125],
        [-0.125, -0.1875, 0.125, -0.125],
        [0.125, -0.1875, -0.125, 0.125],
        [0.125, 0.3125, -0.125, -0.125],
    ])


def test_segment_advantages_with_outcome():
    # Rewards [[1.25]*4, [.25,0,.25,0], [.5,0,0,.25], [1.5,1.5,0,0]].
    # Means: k1 3.5/4 = .875; k2 2.75/4 = .6875; k3 1.5/4 = .375; k4 1.5/4 = .375.
    adv = ppm_segment_advantages(PROGRESS, OUTCOME, 4, valid=VALID)
    close(adv, [
        [0.375, 0.5625, 0.875, 0.875],
        [-0.625, -0.6875, -0.125, -0.375],
        [-0.375, -0.6875, -0.375, -0.125],
        [0.625, 0.8125, -0.375, -0.375],
    ])


def test_segment_advantages_with_std_and_outcome_weight():
    adv = ppm_segment_advantages(PROGRESS, OUTCOME, 4, add_outcome=False, scale=True, eps=1e-4, valid=VALID)
    # k1: [.25,.25,.5,.5], deviations ±.125, var 4·.015625/3; k2: [.25,0,0,.5], deviations [.0625,-.1875,-.1875,.3125],
    # var (.00390625+.03515625+.03515625+.09765625)/3 = .171875/3.
    s1 = math.sqrt(4 * 0.125**2 / 3) + 1e-4
    s2 = math.sqrt(0.171875 / 3) + 1e-4
    close(adv[:, 0], [-0.125 / s1, -0.125 / s1, 0.125 / s1, 0.125 / s1])
    close(adv[:, 1], [0.0625 / s2, -0.1875 / s2, -0.1875 / s2, 0.3125 / s2])
    # outcome_weight = 2 (authors' GSM-Infinite config): k1 rewards [2.25, .25, .5, 2.5], mean 5.5/4 = 1.375.
    adv2 = ppm_segment_advantages(PROGRESS, OUTCOME, 4, valid=VALID, outcome_weight=2.0)
    close(adv2[:, 0], [0.875, -1.125, -0.875, 1.125])


def test_segment_advantages_all_valid_by_default_and_dtype():
    progress = PROGRESS[:3].clone().double()
    progress = torch.cat([progress, torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)])
    adv = ppm_segment_advantages(progress, torch.zeros(4), 4)
    assert adv.dtype == torch.float64
    # k1 rewards [.25, .25, .5, 0], mean .25.
    close(adv[:, 0], [0.0, 0.0, 0.25, -0.25])


def test_nan_row_gets_zero_and_leaves_the_statistics():
    progress = torch.tensor([[0.5, 1.0], [NAN, 0.5], [0.0, 0.5], [0.25, 0.25]])
    # Rows 0, 2, 3 only: rewards [.5,.5], [0,.5], [.25,0]; means k1 .75/3 = .25, k2 1/3.
    expected = [[0.25, 0.5 - 1 / 3], [0.0, 0.0], [-0.25, 0.5 - 1 / 3], [0.0, -1 / 3]]
    close(ppm_segment_advantages(progress, torch.zeros(4), 4), expected)
    # A NaN outcome makes its row unscorable only when the outcome is used.
    progress2 = torch.nan_to_num(progress, nan=0.0)  # row 1 → [0, .5]
    outcome = torch.tensor([0.0, 0.0, NAN, 0.0])
    adv = ppm_segment_advantages(progress2, outcome, 4)
    # Rows 0, 1, 3: rewards [.5,.5], [0,.5], [.25,0] → the same numbers, with row 2 zeroed instead.
    close(adv, [[0.25, 0.5 - 1 / 3], [-0.25, 0.5 - 1 / 3], [0.0, 0.0], [0.0, -1 / 3]])
    adv_no_outcome = ppm_segment_advantages(progress2, outcome, 4, add_outcome=False)
    assert adv_no_outcome[2].abs().sum() > 0


def test_segment_input_validation():
    with pytest.raises(ValueError, match="row 1, segment 0 has 1.5"):
        ppm_segment_advantages(torch.tensor([[0.5], [1.5]]), torch.zeros(2), 2)
    with pytest.raises(ValueError, match="row 0, segment 1"):
        ppm_segment_advantages(torch.tensor([[0.5, -0.1], [0.0, 0.0]]), torch.zeros(2), 2)
    # Out-of-range junk in an empty segment is ignored.
    ppm_segment_advantages(torch.tensor([[0.5, 7.0], [0.0, 0.0]]), torch.zeros(2), 2,
                           valid=torch.tensor([[True, False], [True, True]]))
    with pytest.raises(ValueError, match="shape"):
        ppm_segment_advantages(torch.zeros(2, 2), torch.zeros(3), 2)
    with pytest.raises(ValueError, match="valid must have shape"):
        ppm_segment_advantages(torch.zeros(2, 2), torch.zeros(2), 2, valid=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="group_size=2"):
        ppm_segment_advantages(torch.zeros(3, 2), torch.zeros(3), 2)
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        ppm_segment_advantages(torch.zeros(4), torch.zeros(4), 2)


# ------------------------------------------------------------------------------------- PPM trajectory level
def test_trajectory_advantages_broadcast_final_progress_plus_outcome():
    # Final monotone progress: row 0 1.0, row 1 .5, row 2 .75, row 3 1.0 (last valid segment).
    # + outcome [1, 0, 0, 1] → [2, .5, .75, 2]; mean 5.25/4 = 1.3125 → [.6875, -.8125, -.5625, .6875].
    adv = ppm_trajectory_advantages(PROGRESS, OUTCOME, 4, valid=VALID)
    close(adv, torch.tensor([0.6875, -0.8125, -0.5625, 0.6875]).unsqueeze(1).expand(4, 4))
    # Identical to pushing φ/n + outcome through group_normalize and broadcasting.
    final = torch.tensor([1.0, 0.5, 0.75, 1.0])
    close(adv, group_normalize(final + OUTCOME, 4, scale=False).unsqueeze(1).expand(4, 4))
    close(ppm_trajectory_advantages(final, OUTCOME, 4, scale=True),
          group_normalize(final + OUTCOME, 4, scale=True))
    # Without the outcome: [1, .5, .75, 1], mean .8125.
    close(ppm_trajectory_advantages(final, OUTCOME, 4, add_outcome=False), [0.1875, -0.3125, -0.0625, 0.1875])


# ------------------------------------------------------------------------------------------- PPM baselines
def test_exact_order_progress_is_longest_reached_prefix():
    reached = torch.zeros(2, 3, 4, dtype=torch.bool)
    # Row 0 (n = 4): prefixes reach {2}, {1, 2, 4}, {1, 2, 3, 4} → longest prefixes 0, 2, 4.
    reached[0, 0, [1]] = True
    reached[0, 1, [0, 1, 3]] = True
    reached[0, 2, :] = True
    # Row 1 (n = 3, column 4 is padding even if set): {1, 3}, {1, 3, 4*}, {1, 2, 3} → 1, 1, 3.
    reached[1, 0, [0, 2]] = True
    reached[1, 1, [0, 2, 3]] = True
    reached[1, 2, [0, 1, 2, 3]] = True
    out = exact_order_progress(reached, torch.tensor([4, 3]))
    close(out, [[0.0, 0.5, 1.0], [1 / 3, 1 / 3, 1.0]])
    with pytest.raises(ValueError, match="num_points"):
        exact_order_progress(reached, 5)


def test_process_reward_baseline_scores_each_chunk_alone():
    scores = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.3], [1.0, NAN, 1.0], [1.0, 1.0, 0.0]])
    valid = torch.tensor([[True] * 3, [True, True, False], [True] * 3, [True] * 3])
    outcome = torch.tensor([1.0, 0.0, 0.0, 0.0])
    # Row 2 has a NaN score on a valid chunk → unscorable. Rewards: row 0 [2, 1, 2]; row 1 [0, 1, 0(empty)];
    # row 3 [1, 1, 0]. Means k1 1, k2 1, k3 2/3.
    adv = process_reward_advantages(scores, outcome, 4, valid=valid)
    close(adv, [[1.0, 0.0, 4 / 3], [-1.0, 0.0, -2 / 3], [0.0, 0.0, 0.0], [0.0, 0.0, -2 / 3]])


# ------------------------------------------------------------------------------------------------------ PAPO
EPS = 1e-6


def test_papo_all_correct_different_scores():
    # A_out = 0 (std 0). C = all: scores [1, .5, .5, 0], mean .5, deviations [.5, 0, 0, -.5], var .5/3.
    s = math.sqrt(0.5 / 3) + EPS
    a_out, a_proc = papo_components(torch.ones(4), torch.tensor([1.0, 0.5, 0.5, 0.0]), 4)
    close(a_out, [0, 0, 0, 0])
    close(a_proc, [0.5 / s, 0, 0, -0.5 / s])
    close(papo_advantages(torch.ones(4), torch.tensor([1.0, 0.5, 0.5, 0.0]), 4, lam=0.5),
          [0.25 / s, 0, 0, -0.25 / s])


def test_papo_one_correct_and_all_incorrect():
    # One correct: A_out: mean .25, deviations [.75, -.25 ×3], var .25, std .5; A_proc = 0 (|C| < 2).
    adv = papo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0.5, NAN, NAN, NAN]), 4)
    s = 0.5 + EPS
    close(adv, [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s])
    close(papo_advantages(torch.zeros(4), torch.full((4,), NAN), 4), [0, 0, 0, 0])


def test_papo_mixed_group_and_ablations():
    outcome = torch.tensor([1.0, 1.0, 1.0, 0.0])
    process = torch.tensor([1.0, 0.5, 0.0, NAN])
    # A_out: mean .75, deviations [.25, .25, .25, -.75], var (3·.0625 + .5625)/3 = .25, std .5.
    so = 0.5 + EPS
    a_out = [0.25 / so, 0.25 / so, 0.25 / so, -0.75 / so]
    # A_proc over C = rows 0..2: [1, .5, 0], mean .5, deviations [.5, 0, -.5], var .5/2 = .25, std .5; row 3 → 0.
    sp = 0.5 + EPS
    close(papo_advantages(outcome, process, 4), [a_out[0] + 0.5 / sp, a_out[1], a_out[2] - 0.5 / sp, a_out[3]])
    # Fullnorm: incorrect row enters with r_proc = 0: [1, .5, 0, 0], mean .375, deviations [.625, .125, -.375, -.375],
    # var (.390625 + .015625 + .140625 + .140625)/3 = .6875/3.
    sf = math.sqrt(0.6875 / 3) + EPS
    full = [0.625 / sf, 0.125 / sf, -0.375 / sf, -0.375 / sf]
    close(papo_advantages(outcome, process, 4, process_norm="full"), [a + f for a, f in zip(a_out, full)])
    # Mult: r = r_out·r_proc = [1, .5, 0, 0] with ONE GRPO normalisation and no separate A_out.
    close(papo_advantages(outcome, process, 4, combine="multiplicative"), full)


def test_fullnorm_has_no_correct_subset_gate():
    # One correct row: default A_proc = 0; Fullnorm: [.5, 0, 0, 0], mean .125, deviations [.375, -.125 ×3],
    # var (.140625 + 3·.015625)/3 = .0625, std .25.
    outcome = torch.tensor([1.0, 0.0, 0.0, 0.0])
    process = torch.tensor([0.5, NAN, NAN, NAN])
    _, a_proc = papo_components(outcome, process, 4)
    close(a_proc, [0, 0, 0, 0])
    _, a_full = papo_components(outcome, process, 4, process_norm="full")
    s = 0.25 + EPS
    close(a_full, [0.375 / s, -0.125 / s, -0.125 / s, -0.125 / s])


def test_papo_nan_process_is_absent_but_keeps_a_out():
    # All correct, row 1 not judged: C statistics over [1, 0, .5]: mean .5, deviations [.5, -.5, 0], var .25.
    s = 0.5 + EPS
    adv = papo_advantages(torch.ones(4), torch.tensor([1.0, NAN, 0.0, 0.5]), 4)
    close(adv, [0.5 / s, 0.0, -0.5 / s, 0.0])
    # Two correct, one unjudged → only one scored → A_proc = 0; the unjudged row still gets A_out.
    # A_out: [1, 1, 0, 0], mean .5, deviations ±.5, var 1/3.
    so = math.sqrt(1 / 3) + EPS
    adv = papo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([1.0, NAN, NAN, NAN]), 4)
    close(adv, [0.5 / so, 0.5 / so, -0.5 / so, -0.5 / so])
    # Mult: a correct row without a process score is unscorable ([.8, NaN, 0, 0] → rows 0, 2, 3).
    # [.8, 0, 0], mean .8/3, deviations [1.6/3, -.8/3, -.8/3], var (2.56 + .64 + .64)/9/2 = 3.84/18.
    sm = math.sqrt(3.84 / 18) + EPS
    adv = papo_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.8, NAN, NAN, NAN]), 4,
                          combine="multiplicative")
    close(adv, [1.6 / 3 / sm, 0.0, -0.8 / 3 / sm, -0.8 / 3 / sm], tol=1e-5)


def test_papo_nan_outcome_row_is_unscorable_and_groups_are_independent():
    # Group 1 (G = 4) with row 1 unscorable: [1, 0, 0] → mean 1/3, deviations [2/3, -1/3, -1/3], var 1/3.
    s = math.sqrt(1 / 3) + EPS
    adv = papo_advantages(torch.tensor([1.0, NAN, 0.0, 0.0]), torch.tensor([1.0, 1.0, NAN, NAN]), 4)
    close(adv, [2 / 3 / s, 0.0, -1 / 3 / s, -1 / 3 / s])
    # Two groups of 2: [1, 1 | 1, 0], process [1, 0 | 1, NaN].
    # Group 1: A_out 0; A_proc ±.5/(sqrt(.5) + ε). Group 2: A_out ±.5/(sqrt(.5) + ε); A_proc 0 (|C| = 1).
    s2 = math.sqrt(0.5) + EPS
    adv = papo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 1.0, NAN]), 2)
    close(adv, [0.5 / s2, -0.5 / s2, 0.5 / s2, -0.5 / s2])


def test_papo_validation():
    with pytest.raises(ValueError, match="process_norm"):
        papo_advantages(torch.ones(2), torch.ones(2), 2, process_norm="group")
    with pytest.raises(ValueError, match="combine"):
        papo_advantages(torch.ones(2), torch.ones(2), 2, combine="sum")
    with pytest.raises(ValueError, match="binary.*row 1 has 0.5"):
        papo_advantages(torch.tensor([1.0, 0.5]), torch.ones(2), 2)
    with pytest.raises(ValueError, match="process must lie in"):
        papo_advantages(torch.ones(2), torch.tensor([1.0, 2.0]), 2)
    with pytest.raises(ValueError, match="group_size=4"):
        papo_advantages(torch.ones(6), torch.ones(6), 4)


def test_papo_group_stats():
    # Group 1: all correct, scores [1, 0] → A = ±.5/(sqrt(.5)+ε), active. Group 2: all incorrect → A = 0.
    # Group 3: [1, 0], one correct → A_out = ±.5/(sqrt(.5)+ε), inactive.
    outcome = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    process = torch.tensor([1.0, 0.0, NAN, NAN, NAN, NAN])
    stats = papo_group_stats(outcome, process, 2)
    s = math.sqrt(0.5) + EPS
    assert stats.zero_advantage_fraction == pytest.approx(2 / 6)
    assert stats.proc_active_fraction == pytest.approx(1 / 3)
    assert stats.correct_min_advantage == pytest.approx(-0.5 / s, abs=1e-6)
    assert stats.correct_fraction == pytest.approx(0.5)
    assert stats.process_missing_fraction == pytest.approx(1 / 3)  # row 4 is correct but unjudged
    assert set(stats.to_dict()) >= {"papo/zero_advantage_fraction", "papo/correct_min_advantage"}
    assert math.isnan(papo_group_stats(torch.zeros(2), torch.full((2,), NAN), 2).correct_min_advantage)


def test_papo_process_active_needs_differing_process_scores():
    # Every group has >= 2 correct rows with a process score; only groups whose scores differ move A_proc.
    # Group 1: correct, scores [.5, .5, .5, NaN-incorrect] → A_proc ≡ 0: inactive (the old count said active).
    # Group 2: correct [1, .5], incorrect, incorrect → A_proc = ±.5/(sqrt(.125)+ε): active.
    # Group 3: all four correct, all 1.0 → inactive. Group 4: [1, 1, .5, 1] → active.
    outcome = torch.tensor([1.0, 1, 1, 0] + [1, 1, 0, 0] + [1, 1, 1, 1] + [1, 1, 1, 1])
    process = torch.tensor([.5, .5, .5, NAN] + [1, .5, NAN, NAN] + [1, 1, 1, 1] + [1, 1, .5, 1])
    stats = papo_group_stats(outcome, process, 4)
    assert stats.proc_active_fraction == pytest.approx(2 / 4)
    # Rows with zero advantage: group 3's four (all correct, equal scores), none elsewhere.
    assert stats.zero_advantage_fraction == pytest.approx(4 / 16)
    # An all-equal correct group logs inactive alone; Fullnorm is active wherever filled scores differ (incorrect
    # rows enter as 0), the multiplicative combination never (A_proc is identically 0 there), nor is λ = 0.
    assert papo_group_stats(torch.ones(4), torch.full((4,), .5), 4).proc_active_fraction == 0.0
    assert papo_group_stats(outcome, process, 4, process_norm="full").proc_active_fraction == pytest.approx(3 / 4)
    assert papo_group_stats(outcome, process, 4, combine="multiplicative").proc_active_fraction == 0.0
    assert papo_group_stats(outcome, process, 4, lam=0.0).proc_active_fraction == 0.0


# ------------------------------------------------------------------------ float residue of identical rewards
def _fractions(max_n: int = 10):
    return [(j, n) for n in range(1, max_n + 1) for j in range(n + 1)]


@pytest.mark.parametrize("group_size", [4, 8, 16])
def test_identical_rewards_give_exact_zero_advantages_for_every_fraction(group_size):
    # float32 mean of 16 copies of 3/5 + 1 is off by an ulp (~1.2e-7): before the fix 24 of these groups kept
    # nonzero advantages and escaped the zero-advantage filter (atol 1e-8).
    escaped = []
    for j, n in _fractions():
        progress = torch.full((group_size, 4), j / n, dtype=torch.float32)
        advantages = ppm_segment_advantages(progress, torch.ones(group_size), group_size)
        if not bool(zero_advantage_groups(advantages, group_size).all()) or advantages.abs().max() != 0:
            escaped.append(f"{j}/{n}")
    assert escaped == []


def test_identical_rewards_with_nan_and_both_dtypes_are_exactly_zero():
    for dtype in (torch.float32, torch.float64):
        rewards = torch.tensor([0.7, NAN, 0.7, 0.7, 0.1, 0.3, 0.3, 0.3], dtype=dtype)
        out = group_normalize(rewards + 1 / 3, 4)
        assert out[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
        assert out[4] < 0 < out[5]  # a group that differs still does


@pytest.mark.parametrize("j,n", _fractions())
def test_papo_identical_process_scores_have_no_process_advantage(j, n):
    # G = 16 correct responses, every process score 3/5: A_proc was ±0.056·λ (std + 1e-6 on a float residue).
    outcome, process = torch.ones(16), torch.full((16,), j / n)
    a_out, a_proc = papo_components(outcome, process, 16)
    assert a_proc.abs().max() == 0 and a_out.abs().max() == 0
    assert papo_advantages(outcome, process, 16, lam=10.0).abs().max() == 0


# ------------------------------------------------------------------------------------ TRL's scale_rewards
def test_batch_scale_divides_the_group_centred_rewards_by_the_column_std():
    rewards = torch.tensor([[1.0, 2.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0],
                            [1.0, 0.0], [1.0, 2.0], [1.0, 2.0], [0.0, 2.0]])
    out = group_normalize(rewards, 4, scale="batch", eps=0.0)
    # Column 0: group means .25 and .75 → centred [.75, -.25, -.25, -.25, .25, .25, .25, -.75]; the batch std of
    # [1,0,0,0,1,1,1,0] is sqrt(8·.25/7) = sqrt(2/7). Column 1: group 1 constant → 0; group 2 mean 1.5 →
    # [-1.5, .5, .5, .5]; batch values [2]*5+[0]+[2]*2: mean 1.75, var (7·.0625 + 3.0625)/7 = .5, std sqrt(.5).
    std0, std1 = math.sqrt(2 / 7), math.sqrt(0.5)
    expected = [[0.75 / std0, 0], [-0.25 / std0, 0], [-0.25 / std0, 0], [-0.25 / std0, 0],
                [0.25 / std0, -1.5 / std1], [0.25 / std0, 0.5 / std1], [0.25 / std0, 0.5 / std1],
                [-0.75 / std0, 0.5 / std1]]
    close(out, expected)
    close(group_normalize(rewards, 4, scale="none"), group_normalize(rewards, 4, scale=False))
    close(group_normalize(rewards, 4, scale="group"), group_normalize(rewards, 4, scale=True))
    with pytest.raises(ValueError, match="scale"):
        group_normalize(rewards, 4, scale="per-token")


def test_ppm_estimators_accept_trl_scale_rewards_strings():
    progress = torch.tensor([[0.5, 1.0], [0.0, 0.5], [0.5, 0.5], [0.0, 0.0]])
    outcome = torch.tensor([1.0, 0.0, 0.0, 0.0])
    rewards = ppm_segment_rewards(progress, outcome)
    close(ppm_segment_advantages(progress, outcome, 2, scale="batch", eps=0.0),
          group_normalize(rewards, 2, scale="batch", eps=0.0))
    assert not torch.allclose(ppm_segment_advantages(progress, outcome, 2, scale="batch"),
                              ppm_segment_advantages(progress, outcome, 2, scale="group"))


# ------------------------------------------------------------------------------------------ estimator choice
def test_ppm_config_fields_select_one_estimator_and_undefined_pairs_are_errors():
    assert ppm_estimator("segment", "ppm") is ppm_segment_advantages
    assert ppm_estimator("segment", "exact_order") is ppm_segment_advantages  # the baseline differs in its progress
    assert ppm_estimator("trajectory", "ppm") is ppm_trajectory_advantages
    assert ppm_estimator("trajectory", "exact_order") is ppm_trajectory_advantages
    assert ppm_estimator("segment", "process_reward") is process_reward_advantages
    with pytest.raises(ValueError, match="progress_mode='process_reward' is not an estimator.*segment-level only"):
        ppm_estimator("trajectory", "process_reward")
    for granularity, mode in [("token", "ppm"), ("segment", "ppm_segment"), ("Segment", "ppm"), ("segment", None)]:
        with pytest.raises(ValueError, match=f"no PPM estimator for granularity={granularity!r}, "
                                             f"progress_mode={mode!r}"):
            ppm_estimator(granularity, mode)


# ------------------------------------------------------------------ multi_objective_aggregation="normalize_then_sum"
def test_normalize_then_sum_by_hand():
    """One group of 3, two reward functions, weights (1, 0.5). r1 = (1, 2, 3): mean 2, sample std 1 → z1 = (−1, 0, 1);
    r2 = (0, 0, 1): mean 1/3, std √(1/3) → z2 = (−1/√3, −1/√3, 2/√3) = (−0.57735, −0.57735, 1.15470).
    Σ w·z = z1 + 0.5·z2 = (−1.28868, −0.28868, 1.57735)."""
    from ppm_trl.advantages import normalize_then_sum

    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0]])
    out = normalize_then_sum(rewards, torch.tensor([1.0, 0.5]), 3, eps=0.0)
    assert torch.allclose(out, torch.tensor([-1.288675, -0.288675, 1.577350]), atol=1e-5)
    # A NaN value stays out of its function's statistics and adds 0; an all-NaN row is NaN; a constant function adds 0.
    rewards = torch.tensor([[1.0, 5.0], [float("nan"), 5.0], [3.0, 5.0], [float("nan"), float("nan")],
                            [0.0, 1.0], [2.0, 1.0]])
    out = normalize_then_sum(rewards, torch.tensor([1.0, 1.0]), 3)  # eps 1e-4: a constant function's 0/0 is 0
    # group 1: r1 (1, ·, 3): mean 2, std √2 → (−1/√2, 0, 1/√2); group 2: row 0 unscorable, r1 (·, 0, 2) → (·, −1/√2,
    # 1/√2), r2 (·, 1, 1) constant → 0.
    h = 2 ** -0.5
    assert torch.allclose(out[:3], torch.tensor([-h, 0.0, h]), atol=1e-4)
    assert torch.isnan(out[3]) and torch.allclose(out[4:], torch.tensor([-h, h]), atol=1e-4)


def test_ppm_segment_advantages_with_normalize_then_sum_outcome():
    """PPM's eq. 3 + App. B with the outcome Σ_f w_f·z_f of the test above, K = 2, no std division (PPM's default):
    progress m = (0, .5), (.5, .5), (.5, 1) → r = (0, .5), (.5, 0), (.5, .5); + outcome (−1.28868, −0.28868, 1.57735)
    per segment → segment 1 (−1.28868, 0.21132, 2.07735), segment 2 (−0.78868, −0.28868, 2.07735), each of mean 1/3
    → advantages (−1.62201, −0.12201, 1.74402) and (−1.12201, −0.62201, 1.74402)."""
    from ppm_trl.advantages import normalize_then_sum
    from ppm_trl.ppm.ppm_estimators import ppm_segment_advantages

    outcome = normalize_then_sum(torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0]]), torch.tensor([1.0, 0.5]), 3,
                                 eps=0.0)
    progress = torch.tensor([[0.0, 0.5], [0.5, 0.5], [0.5, 1.0]])
    expected = torch.tensor([[-1.622008, -1.122008], [-0.122008, -0.622008], [1.744017, 1.744017]])
    assert torch.allclose(ppm_segment_advantages(progress, outcome, 3, scale=False), expected, atol=1e-5)


def test_papo_advantages_with_normalize_then_sum_outcome():
    """PAPO: the verifier's binary outcome (1, 0, 1) still picks the correct subset; A_out is TRL's normalize_then_sum
    advantage of accuracy (1, 0, 1) and format (.2, 1, .8) with weights (1, .5): z_acc = (1, −2, 1)/√3 =
    (0.57735, −1.15470, 0.57735), z_fmt = (−.46667, .33333, .13333)/0.41633 = (−1.12090, 0.80064, 0.32026), sum
    (0.01690, −0.75438, 0.73748), over the batch (mean 0, std 0.74607) → A_out (0.02265, −1.01113, 0.98848).
    A_proc over C = {0, 2} with process (.9, .3): (0.70711, 0, −0.70711). λ = 1 → (0.72976, −1.01113, 0.28137)."""
    from ppm_trl.advantages import batch_normalize, normalize_then_sum
    from ppm_trl.papo.papo_estimators import papo_advantages

    rewards = torch.tensor([[1.0, 0.2], [0.0, 1.0], [1.0, 0.8]])
    a_out = batch_normalize(normalize_then_sum(rewards, torch.tensor([1.0, 0.5]), 3, eps=0.0), eps=0.0)
    assert torch.allclose(a_out, torch.tensor([0.022654, -1.011135, 0.988480]), atol=1e-5)
    outcome, process = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.9, float("nan"), 0.3])
    advantages = papo_advantages(outcome, process, 3, lam=1.0, eps=0.0, outcome_advantage=a_out)
    assert torch.allclose(advantages, torch.tensor([0.729761, -1.011135, 0.281374]), atol=1e-5)
    with pytest.raises(ValueError, match="decoupled only|combine='decoupled' only"):
        papo_advantages(outcome, process, 3, combine="multiplicative", outcome_advantage=a_out)


def test_normalize_then_sum_configs(tmp_path):
    """PPM and PAPO (decoupled) accept it; PAPO's Mult ablation has no separate A_out and is refused, saying why."""
    from helpers import TINY_ARGS

    from ppm_trl.papo.papo_config import PAPOConfig
    from ppm_trl.ppm.ppm_config import PPMConfig

    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                    multi_objective_aggregation="normalize_then_sum", **TINY_ARGS)
    PPMConfig(**settings)
    PAPOConfig(**settings)
    with pytest.raises(ValueError, match="combine='multiplicative': it normalises .*combine='decoupled'"):
        PAPOConfig(**settings, combine="multiplicative")
