"""One step of Algorithm 1 as data (ppm_trl/arg/guidance_step.py), without TRL: the mode dispatch, the failure
scan, group plans, acceptance with the reference fallback, the selector's feedback batch and the logged metrics, by hand."""

from __future__ import annotations

import math
import pickle
import random

import pytest
import torch

from ppm_trl.arg.arg_config import ARG_MODES
from ppm_trl.arg.guidance_step import (
    ContinuationOutcome,
    FailedGroup,
    FailureScan,
    GroupOutcome,
    GroupPlan,
    GroupStatus,
    GuidanceMode,
    VerifiedContinuation,
    all_failure_groups,
    guidance_metrics,
    plan_guided_group,
    resolve_group,
    scan_failures,
    screen_reference,
    selector_feedback,
)
from ppm_trl.arg.prefixes import EMPTY_PREFIX, GuidedPrefix
from ppm_trl.arg.selector import PrefixSelector

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

REFERENCE = "One. Two. So \\boxed{3}"  # as in test_arg_core.test_plan_reference_prefixes_by_hand
OFFSETS = [(0, 3), (3, 4), (4, 5), (5, 8), (8, 9), (9, 10), (10, 12), (12, 13), (13, 19), (19, 20), (20, 21),
           (21, 22)]  # cuts 2, 3, 5, 6
LOGPROBS = [-2.0, -0.5, -0.5, -1.0, -1.0, -0.25, -0.25, -0.5, -1.0, -1.0, -1.0, -1.0]  # S = 10, 8, 7.5, 7, 6, 5, ...
CAPS = dict(max_accepted=2, max_empty=2, max_guided=1)


# ---------------------------------------------------------------------------------------------------------------
# Mode, chosen once
# ---------------------------------------------------------------------------------------------------------------


def test_every_configurable_mode_has_one_dispatch_entry():
    assert sorted(mode.value for mode in GuidanceMode) == sorted(ARG_MODES)
    table = {mode.value: (mode.adaptive, mode.continues, mode.falls_back_to_reference) for mode in GuidanceMode}
    assert table == {"arg": (True, True, True), "reference_insertion": (False, False, True),
                     "resampling": (False, True, False)}
    with pytest.raises(ValueError):
        GuidanceMode("guided")


def test_fixed_plans_and_logged_levels():
    assert GuidanceMode.RESAMPLING.fixed_plan(3) == GroupPlan(GroupStatus.GUIDED, (EMPTY_PREFIX,) * 3)
    assert GuidanceMode.REFERENCE_INSERTION.fixed_plan(3) == GroupPlan(GroupStatus.FALLBACK_ONLY)
    with pytest.raises(ValueError, match="surprisal"):
        GuidanceMode.ARG.fixed_plan(3)
    assert GuidanceMode.RESAMPLING.logged_levels([0.5, 0.25]) == [0.5, 0.25, 1.0]  # its continuations are α = 1
    assert GuidanceMode.RESAMPLING.logged_levels([1.0, 0.5]) == [1.0, 0.5]
    assert GuidanceMode.ARG.logged_levels([0.5, 0.25]) == [0.5, 0.25]
    assert GuidanceMode.REFERENCE_INSERTION.logged_levels((1, 0.5)) == [1.0, 0.5]


# ---------------------------------------------------------------------------------------------------------------
# Which groups are guided, and on which process
# ---------------------------------------------------------------------------------------------------------------


def test_all_failure_and_unscorable_groups():
    nan = math.nan
    verdict = torch.tensor([0, 0, 0,  -1, 0, 0,  0, nan, 0,  nan, 1, 0,  0.2, 0, 0,  nan, nan, nan])
    failed, unscorable = all_failure_groups(verdict, 3)
    assert failed.tolist() == [True, True, False, False, False, False]  # a negative reward is a failure too
    assert unscorable.tolist() == [False, False, True, False, False, True]  # NaN and no correct row
    with pytest.raises(ValueError, match="groups of 4"):
        all_failure_groups(verdict, 4)


def test_scan_failures_gives_each_process_its_groups_with_global_order():
    verdict = torch.tensor([0.0] * 4 + [1.0, 0.0] + [0.0] * 2 + [math.nan, 0.0] + [0.0, 0.0])  # 6 groups of 2
    whole = scan_failures(verdict, 2)
    assert (whole.num_failed, whole.num_unscorable, whole.max_local) == (4, 1, 4)
    assert whole.groups == (FailedGroup(0, 0), FailedGroup(1, 2), FailedGroup(2, 6), FailedGroup(3, 10))
    # Two processes with 3 groups (6 rows) each: rows are local, orders global, max_local pads both forwards.
    first, second = (scan_failures(verdict, 2, rank, 2) for rank in (0, 1))
    assert first.groups == (FailedGroup(0, 0), FailedGroup(1, 2))
    assert second.groups == (FailedGroup(2, 0), FailedGroup(3, 4))
    assert first.max_local == second.max_local == 2 and first.num_failed == second.num_failed == 4
    three = [scan_failures(verdict, 2, rank, 3) for rank in range(3)]
    assert [len(scan.groups) for scan in three] == [2, 1, 1] and {scan.max_local for scan in three} == {2}
    with pytest.raises(ValueError, match="split evenly over 4 processes"):
        scan_failures(verdict, 2, 0, 4)
    assert scan_failures(torch.ones(4), 2) == FailureScan(0, 0, 0, ())


def test_screen_reference():
    assert screen_reference(REFERENCE, "\\boxed", skip_invalid=False) is None
    for bad, problem in (("   ", "non-empty"), (None, "non-empty"), ("The answer is 3.", "no final answer marker"),
                         ("So \\boxed{3", "unclosed or empty")):
        assert screen_reference(bad, "\\boxed", skip_invalid=True) == GroupPlan(GroupStatus.INVALID_REFERENCE)
        with pytest.raises(ValueError, match=problem):
            screen_reference(bad, "\\boxed", skip_invalid=False)


# ---------------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------------


def test_plan_guided_group_follows_the_sampled_levels():
    levels = (1.0, 0.5, 0.25)
    plan = plan_guided_group(LOGPROBS, [0.25, 1.0, 0.25, 0.5], levels, REFERENCE, OFFSETS)
    assert plan.status is GroupStatus.GUIDED
    assert [(p.level, p.prefix_len, p.surprisal_ratio) for p in plan.prefixes] == [
        (0.25, 6, 0.475), (1.0, 0, 1.0), (0.25, 6, 0.475), (0.5, 5, 0.5)]  # test_plan_reference_prefixes_by_hand
    assert not any(p.collapsed for p in plan.prefixes)
    # A budget below the first cut: every α < 1 continues from the empty prefix, credited to α, counted collapsed.
    capped = plan_guided_group(LOGPROBS, [0.5, 1.0, 0.25], levels, REFERENCE, OFFSETS, max_prefix_tokens=1)
    assert [(p.level, p.prefix_len, p.surprisal_ratio, p.collapsed) for p in capped.prefixes] == [
        (0.5, 0, 1.0, True), (1.0, 0, 1.0, False), (0.25, 0, 1.0, True)]


@pytest.mark.parametrize("logprobs", [[0.0] * 10, [-math.inf] + [-1.0] * 9, [math.nan] * 10])
def test_plan_guided_group_without_a_usable_surprisal_has_no_continuations(logprobs):
    """Alg. 1 line 6: S_0 = 0, ∞ or undefined → no continuations (the reference fallback follows)."""
    assert plan_guided_group(logprobs, [0.5, 0.25], (1.0, 0.5, 0.25), REFERENCE, OFFSETS) == GroupPlan(
        GroupStatus.DEGENERATE_SURPRISAL)


# ---------------------------------------------------------------------------------------------------------------
# Acceptance, fallback and feedback
# ---------------------------------------------------------------------------------------------------------------


def _prefix(level, length, ratio=None):
    return GuidedPrefix(level, length, 1.0 if length == 0 else ratio)


def test_resolve_group_accepts_by_the_paper_rule_and_records_every_continuation():
    continuations = [
        VerifiedContinuation(_prefix(0.5, 5, 0.5), correct=True, copies_reference=False),  # guided, longer
        VerifiedContinuation(_prefix(1.0, 0), correct=False, copies_reference=False),
        VerifiedContinuation(_prefix(0.25, 3, 0.7), correct=True, copies_reference=False),  # shortest guided
        VerifiedContinuation(_prefix(1.0, 0), correct=True, copies_reference=False, trainable=False),  # truncated
        VerifiedContinuation(_prefix(0.25, 2, 0.8), correct=True, copies_reference=True),  # a copy: never accepted
        VerifiedContinuation(_prefix(1.0, 0), correct=True, copies_reference=False),  # empty prefix first
    ]
    plan = GroupPlan(GroupStatus.GUIDED, tuple(c.prefix for c in continuations))
    outcome = resolve_group(7, plan, continuations, **CAPS, falls_back=True, reference_fits=True)
    assert outcome.accepted == (5, 2) and outcome.inserted == 2 and not outcome.fallback
    assert [c.feedback for c in outcome.continuations] == [0.5, 0.0, 0.7, 1.0, 0.0, 1.0]  # eq. 7; copy → 0
    assert [c.accepted for c in outcome.continuations] == [False, False, True, False, False, True]
    assert [c.success for c in outcome.continuations] == [True, False, True, True, False, True]
    unweighted = resolve_group(7, plan, continuations, **CAPS, falls_back=True, reference_fits=True,
                               surprisal_weighting=False)
    assert [c.feedback for c in unweighted.continuations] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("falls_back, fits, expected", [
    (True, True, (True, False, 1)), (True, False, (False, True, 0)),  # too long: skipped, counted
    (False, True, (False, False, 0)), (False, False, (False, False, 0)),  # resampling: never the reference
])
def test_resolve_group_falls_back_only_when_nothing_is_accepted(falls_back, fits, expected):
    failures = [VerifiedContinuation(_prefix(1.0, 0), correct=False, copies_reference=False)] * 2
    for plan, continuations in ((GroupPlan(GroupStatus.GUIDED, (EMPTY_PREFIX,) * 2), failures),
                                (GroupPlan(GroupStatus.FALLBACK_ONLY), []),
                                (GroupPlan(GroupStatus.DEGENERATE_SURPRISAL), [])):
        outcome = resolve_group(0, plan, continuations, **CAPS, falls_back=falls_back, reference_fits=fits)
        assert (outcome.fallback, outcome.fallback_too_long, outcome.inserted) == expected
        assert outcome.status is plan.status and len(outcome.continuations) == len(continuations)
    success = [VerifiedContinuation(EMPTY_PREFIX, correct=True, copies_reference=False)]
    accepted = resolve_group(0, GroupPlan(GroupStatus.GUIDED, (EMPTY_PREFIX,)), success, **CAPS,
                             falls_back=falls_back, reference_fits=fits)
    assert (accepted.accepted, accepted.fallback, accepted.fallback_too_long) == ((0,), False, False)


def _record(level, feedback, correct=True, copies=False, accepted=False, collapsed=False):
    return ContinuationOutcome(level, collapsed, correct, copies, accepted, feedback)


def test_selector_feedback_is_every_continuation_in_global_group_order():
    outcomes = [
        GroupOutcome(2, GroupStatus.GUIDED, (_record(0.25, 1.0, collapsed=True), _record(1.0, 0.0, correct=False))),
        GroupOutcome(0, GroupStatus.GUIDED, (_record(0.5, 0.4), _record(0.5, 0.0, copies=True))),
        GroupOutcome(1, GroupStatus.DEGENERATE_SURPRISAL, fallback=True),
    ]
    expected = ([0.5, 0.5, 0.25, 1.0], [0.4, 0.0, 1.0, 0.0])  # collapsed ones included (eq. 12, App. H.1)
    for _ in range(3):  # gathered from the processes in any order
        random.shuffle(outcomes)
        assert selector_feedback(outcomes) == expected
    assert selector_feedback([]) == ([], [])


def test_outcomes_survive_gather_object_pickling():
    outcome = GroupOutcome(3, GroupStatus.GUIDED, (_record(0.5, 0.25, accepted=True),), (0,), fallback=False)
    assert pickle.loads(pickle.dumps([outcome])) == [outcome]


# ---------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------


def test_guidance_metrics_by_hand():
    selector = PrefixSelector(levels=(1.0, 0.5, 0.25))
    outcomes = [
        GroupOutcome(0, GroupStatus.GUIDED, (
            _record(1.0, 1.0, accepted=True), _record(0.5, 0.0, copies=True), _record(0.5, 0.6, accepted=True),
        ), accepted=(0, 2)),
        GroupOutcome(1, GroupStatus.GUIDED, (
            _record(1.0, 0.0, correct=False), _record(0.5, 0.0, correct=False), _record(1.0, 0.0, correct=False),
        ), fallback=True),
        GroupOutcome(2, GroupStatus.GUIDED, (_record(0.5, 1.0, collapsed=True),) * 3, fallback_too_long=True),
        GroupOutcome(3, GroupStatus.DEGENERATE_SURPRISAL, fallback=True),
        GroupOutcome(4, GroupStatus.INVALID_REFERENCE),
    ]
    metrics = guidance_metrics(outcomes, FailureScan(5, 2, 3, ()), GuidanceMode.ARG, selector)
    third = 1 / 3
    assert metrics == {
        "arg/all_failure_groups": 5, "arg/unscorable_groups": 2, "arg/guided_groups": 3,
        "arg/groups_with_accepted": 1, "arg/rescue_rate": 1 / 5,  # the reference fallback is no rescue (App. G.2)
        "arg/fallback_groups": 2, "arg/fallback_too_long": 1, "arg/degenerate_surprisal_groups": 1,
        "arg/invalid_reference_groups": 1, "arg/inserted_rows": 4, "arg/continuations": 9, "arg/collapsed_levels": 3,
        "arg/correct_rate/alpha_1": third, "arg/copy_rate/alpha_1": 0.0, "arg/success_rate/alpha_1": third,
        "arg/acceptance_rate/alpha_1": third, "arg/mean_feedback/alpha_1": third,
        # α = ½: 6 continuations, 5 correct of which 1 copy, 1 accepted, W = 0, 0.6, 0, 1, 1, 1
        "arg/correct_rate/alpha_0.5": 5 / 6, "arg/copy_rate/alpha_0.5": 1 / 6, "arg/success_rate/alpha_0.5": 4 / 6,
        "arg/acceptance_rate/alpha_0.5": 1 / 6, "arg/mean_feedback/alpha_0.5": pytest.approx(3.6 / 6),
        # α = ¼ had no continuation: no rates (not 0)
        "arg/selector_prob/alpha_1": pytest.approx(third), "arg/selector_prob/alpha_0.5": pytest.approx(third),
        "arg/selector_prob/alpha_0.25": pytest.approx(third), "arg/selector_baseline": 0.0,
    }


def test_guidance_metrics_without_failures_or_with_resampling_levels():
    selector = PrefixSelector(levels=(0.5, 0.25))
    quiet = guidance_metrics([], FailureScan(0, 1, 0, ()), GuidanceMode.ARG, selector)
    assert "arg/rescue_rate" not in quiet and not any("rate/" in name for name in quiet)  # no denominator, no rate
    assert quiet["arg/continuations"] == 0 and quiet["arg/unscorable_groups"] == 1
    resampled = [GroupOutcome(0, GroupStatus.GUIDED, (_record(1.0, 1.0, accepted=True), _record(1.0, 0.0)), (0,))]
    metrics = guidance_metrics(resampled, FailureScan(1, 0, 1, ()), GuidanceMode.RESAMPLING, selector)
    assert metrics["arg/acceptance_rate/alpha_1"] == 0.5 and metrics["arg/rescue_rate"] == 1.0
    assert sorted(name for name in metrics if "selector_prob" in name) == [  # the selector's own levels only
        "arg/selector_prob/alpha_0.25", "arg/selector_prob/alpha_0.5"]
