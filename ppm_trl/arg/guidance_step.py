"""One step of ARG's Algorithm 1 as data: the mode (`GuidanceMode`, the ablations of §5.3), the all-failure groups
(`scan_failures`), each group's plan (`GroupPlan`: `plan_guided_group`, `screen_reference`), what verification
found (`VerifiedContinuation`), what the group got (`resolve_group` → `GroupOutcome`), the selector's feedback
batch (`selector_feedback`) and the step's metrics (`guidance_metrics`). The trainer (`arg_trainer.py`) only scores,
generates, verifies, gathers and replaces rows. torch + stdlib only.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from ..advantages import process_share
from .acceptance import Candidate, accept_candidates, continuation_feedback
from .prefixes import EMPTY_PREFIX, GuidedPrefix, plan_reference_prefixes
from .references import reference_problem
from .selector import PrefixSelector, mean_feedback_per_level


class GuidanceMode(str, Enum):
    """What an all-failure group gets (`ARGConfig.arg_mode`; the ablations are §5.3's). Chosen once per trainer."""

    ARG = "arg"  # selector levels → surprisal prefixes → continuations; reference fallback; the selector learns
    REFERENCE_INSERTION = "reference_insertion"  # no continuations: the reference replaces one failure
    RESAMPLING = "resampling"  # K continuations from the empty prefix, every correct one kept (App. G.2); no fallback

    @property
    def adaptive(self) -> bool:
        """Levels drawn from the selector, prefixes cut by the reference surprisal, the selector trained on W."""
        return self is GuidanceMode.ARG

    @property
    def continues(self) -> bool:
        """Generates continuations (every process then joins the generation and verification collectives)."""
        return self is not GuidanceMode.REFERENCE_INSERTION

    @property
    def falls_back_to_reference(self) -> bool:
        """A group with no accepted continuation gets the reference (§4.3)."""
        return self is not GuidanceMode.RESAMPLING

    def fixed_plan(self, num_continuations: int) -> GroupPlan:
        """The plan of a valid group in a mode without surprisal: K empty prefixes (resampling) or none."""
        if self.adaptive:
            raise ValueError("arg mode plans each group from its reference surprisal (plan_guided_group)")
        if self.continues:
            return GroupPlan(GroupStatus.GUIDED, (EMPTY_PREFIX,) * num_continuations)
        return GroupPlan(GroupStatus.FALLBACK_ONLY)

    def logged_levels(self, selector_levels: Sequence[float]) -> list[float]:
        """Levels with per-level metrics: the selector's, and α = 1 for resampling (its only level)."""
        levels = [float(level) for level in selector_levels]
        if self is GuidanceMode.RESAMPLING and 1.0 not in levels:
            levels.append(1.0)
        return levels


class GroupStatus(str, Enum):
    """What planning decided for one all-failure group."""

    GUIDED = "guided"  # continuations planned
    FALLBACK_ONLY = "fallback_only"  # reference insertion: no continuations
    DEGENERATE_SURPRISAL = "degenerate_surprisal"  # S_0 not in (0, ∞): no continuations (Alg. 1 line 6)
    INVALID_REFERENCE = "invalid_reference"  # skipped (arg_skip_invalid_references), counted


@dataclass(frozen=True)
class GroupPlan:
    """One all-failure group's continuations: the prefix (level, length, S_t/S_0) of each, in sampling order."""

    status: GroupStatus
    prefixes: tuple[GuidedPrefix, ...] = ()


def all_failure_groups(verdict, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(failed, unscorable) per group of `group_size` consecutive rows of the verifier's rewards (NaN = unscorable).

    failed: every row scored and ≤ 0 (the groups ARG guides); unscorable: some row unscorable and none correct (not
    guided, counted). Both (num_groups,) bool.
    """
    verdict = torch.as_tensor(verdict).reshape(-1)
    if group_size < 1 or verdict.numel() % group_size:
        raise ValueError(f"{verdict.numel()} rewards do not split into groups of {group_size}")
    scored = ~torch.isnan(verdict)
    failed = (scored & (verdict <= 0)).view(-1, group_size).all(dim=1)
    unscorable = (~scored).view(-1, group_size).any(dim=1) & ~(verdict > 0).view(-1, group_size).any(dim=1)
    return failed, unscorable


@dataclass(frozen=True)
class FailedGroup:
    """An all-failure group held by this process."""

    order: int  # position among the step's all-failure groups, in global order (the same on every process)
    first_row: int  # this process's index of the group's first row


@dataclass(frozen=True)
class FailureScan:
    """The step's all-failure groups as one process sees them (Alg. 1 line 4)."""

    num_failed: int  # all-failure groups of the step, on every process
    num_unscorable: int  # groups with an unscorable row and no correct one: not guided, counted
    max_local: int  # the most all-failure groups one process holds: pads every process's surprisal forward
    groups: tuple[FailedGroup, ...]  # this process's, in order


def scan_failures(verdict, group_size: int, process_index: int = 0, num_processes: int = 1) -> FailureScan:
    """`all_failure_groups` of the gathered verifier rewards (process p holds the p-th equal share of the groups)."""
    failed, unscorable = all_failure_groups(verdict, group_size)
    if not 0 <= process_index < num_processes or len(failed) % num_processes:
        raise ValueError(f"{len(failed)} groups do not split evenly over {num_processes} processes")
    per_process = len(failed) // num_processes
    local = process_share(process_index, per_process)
    groups = tuple(
        FailedGroup(order, (group - local.start) * group_size)
        for order, group in enumerate(failed.nonzero().flatten().tolist())
        if local.start <= group < local.stop
    )
    max_local = int(failed.view(num_processes, per_process).sum(dim=1).max()) if len(failed) else 0
    return FailureScan(int(failed.sum()), int(unscorable.sum()), max_local, groups)


def screen_reference(reference, answer_marker: str, skip_invalid: bool) -> GroupPlan | None:
    """None when a failed group's `reference` can guide; else the INVALID_REFERENCE plan with `skip_invalid`
    (skipped, counted) or a ValueError that names the problem (rows met during training, e.g. iterable datasets)."""
    problem = reference_problem(reference, answer_marker)
    if problem is None:
        return None
    if not skip_invalid:
        raise ValueError(f"ARG: reference {reference!r:.80} of a training row is invalid: {problem}")
    return GroupPlan(GroupStatus.INVALID_REFERENCE)


def plan_guided_group(
    token_logprobs,
    sampled_levels: Sequence[float],
    levels: Sequence[float],
    text: str,
    token_offsets,
    answer_marker: str | None = "\\boxed",
    max_prefix_tokens: int | None = None,
) -> GroupPlan:
    """ARG's plan for one group (§4.1, App. E.2): one continuation per sampled level, at that level's snapped prefix of
    the reference (`plan_reference_prefixes` over all `levels`); none when S_0 ∉ (0, ∞) (Alg. 1 line 6).

    A level whose valid cuts all lie past the budget continues from the empty prefix: that is t_x(α), so the
    continuation is credited to the sampled α with W at the adjusted prefix (S_0/S_0 = 1; eq. 12, App. H.1) and only
    counted as collapsed (`GuidedPrefix.collapsed`).
    """
    total = -float(torch.as_tensor(token_logprobs, dtype=torch.float64).sum())
    if not 0.0 < total < math.inf:
        return GroupPlan(GroupStatus.DEGENERATE_SURPRISAL)
    plan = plan_reference_prefixes(token_logprobs, levels, text, token_offsets, answer_marker, max_prefix_tokens)
    return GroupPlan(GroupStatus.GUIDED, tuple(plan[float(level)] for level in sampled_levels))


@dataclass(frozen=True)
class VerifiedContinuation:
    """A generated continuation h_t ⊕ Z of a planned prefix, after verification."""

    prefix: GuidedPrefix
    correct: bool  # the verifier's verdict
    copies_reference: bool  # the completion is the reference itself (not a success, eq. 4's d_t)
    trainable: bool = True  # False: truncated while truncated rows are masked out of the loss (cannot fill a slot)


@dataclass(frozen=True)
class ContinuationOutcome:
    """One continuation as the selector and the metrics see it."""

    level: float
    collapsed: bool
    correct: bool
    copies_reference: bool
    accepted: bool
    feedback: float  # W (eq. 7)

    @property
    def success(self) -> bool:
        return self.correct and not self.copies_reference


@dataclass(frozen=True)
class GroupOutcome:
    """What guidance did for one all-failure group; gathered from every process once per step."""

    order: int
    status: GroupStatus
    continuations: tuple[ContinuationOutcome, ...] = ()
    accepted: tuple[int, ...] = ()  # indices of the inserted continuations, in acceptance order
    fallback: bool = False  # the reference was inserted
    fallback_too_long: bool = False  # the reference was due but longer than the budget (inserting it cut would
    # lose its boxed answer): skipped, counted

    @property
    def inserted(self) -> int:
        return len(self.accepted) + int(self.fallback)


def resolve_group(
    order: int,
    plan: GroupPlan,
    continuations: Sequence[VerifiedContinuation],
    *,
    max_accepted: int,
    max_empty: int,
    max_guided: int,
    falls_back: bool,
    reference_fits: bool,
    surprisal_weighting: bool = True,
) -> GroupOutcome:
    """§4.3 for one group: accept candidates (`accept_candidates`), else fall back to the reference when the mode does
    and it fits the budget; each continuation's feedback W (eq. 7, `continuation_feedback`)."""
    accepted = accept_candidates(
        [Candidate(c.correct and c.trainable, c.copies_reference, c.prefix.prefix_len) for c in continuations],
        max_accepted, max_empty, max_guided,
    )
    records = tuple(
        ContinuationOutcome(
            level=c.prefix.level, collapsed=c.prefix.collapsed, correct=c.correct,
            copies_reference=c.copies_reference, accepted=index in accepted,
            feedback=continuation_feedback(c.correct, c.copies_reference, c.prefix.surprisal_ratio,
                                           surprisal_weighting),
        )
        for index, c in enumerate(continuations)
    )
    due = falls_back and not accepted
    return GroupOutcome(order, plan.status, records, tuple(accepted), fallback=due and reference_fits,
                        fallback_too_long=due and not reference_fits)


def selector_feedback(outcomes: Sequence[GroupOutcome]) -> tuple[list[float], list[float]]:
    """(levels, W) of every continuation of the step, in global group order: the batch of one selector update.

    Every continuation enters with its sampled level α_j and W at its adjusted prefix (§4.2: "every continuation
    provides the selector feedback"; App. E.2, H.1), collapsed ones included: dropping them would bias eq. 12
    against levels that often collapse.
    """
    records = [c for outcome in sorted(outcomes, key=lambda o: o.order) for c in outcome.continuations]
    return [c.level for c in records], [c.feedback for c in records]


def guidance_metrics(
    outcomes: Sequence[GroupOutcome], scan: FailureScan, mode: GuidanceMode, selector: PrefixSelector
) -> dict[str, float]:
    """The `arg/...` metrics of one step from every process's outcomes (after the selector update).

    A rate without a denominator (no all-failure group, no continuation at a level) is absent, not 0.
    """
    num_failed, levels = scan.num_failed, mode.logged_levels(selector.levels)
    outcomes = sorted(outcomes, key=lambda o: o.order)
    records = [c for outcome in outcomes for c in outcome.continuations]
    accepted_groups = sum(any(c.accepted for c in outcome.continuations) for outcome in outcomes)
    statuses = Counter(outcome.status for outcome in outcomes)
    metrics = {
        "arg/all_failure_groups": num_failed,
        "arg/unscorable_groups": scan.num_unscorable,
        "arg/guided_groups": statuses[GroupStatus.GUIDED],
        "arg/groups_with_accepted": accepted_groups,
    }
    if num_failed:  # App. G.2's rescue rate: groups that accept a candidate (reference fallback excluded)
        metrics["arg/rescue_rate"] = accepted_groups / num_failed
    metrics.update({
        "arg/fallback_groups": sum(outcome.fallback for outcome in outcomes),
        "arg/fallback_too_long": sum(outcome.fallback_too_long for outcome in outcomes),
        "arg/degenerate_surprisal_groups": statuses[GroupStatus.DEGENERATE_SURPRISAL],
        "arg/invalid_reference_groups": statuses[GroupStatus.INVALID_REFERENCE],
        "arg/inserted_rows": sum(outcome.inserted for outcome in outcomes),
        "arg/continuations": len(records),
        "arg/collapsed_levels": sum(c.collapsed for c in records),
    })
    mean_feedback = mean_feedback_per_level([c.level for c in records], [c.feedback for c in records], levels)
    for level in levels:
        picked = [c for c in records if c.level == level]
        if picked:  # correct_rate counts byte copies of the reference; success_rate (eq. 4's d_t) does not
            name = f"alpha_{level:g}"
            for metric, value in (("correct_rate", lambda c: c.correct), ("copy_rate", lambda c: c.copies_reference),
                                  ("success_rate", lambda c: c.success), ("acceptance_rate", lambda c: c.accepted)):
                metrics[f"arg/{metric}/{name}"] = sum(value(c) for c in picked) / len(picked)
            metrics[f"arg/mean_feedback/{name}"] = mean_feedback[level]
    for level, prob in zip(levels, selector.probs().tolist()):
        metrics[f"arg/selector_prob/alpha_{level:g}"] = prob
    metrics["arg/selector_baseline"] = selector.baseline
    return metrics


def inserted_row_statistics(token_logps: Sequence[Sequence[float]], unsampled: Sequence[int]) -> list[float]:
    """[Σ log π over unsampled tokens, their count, Σ log π over sampled tokens, their count] of the rows guidance
    inserted: each row's first `unsampled[i]` tokens were not sampled by the policy (the reference prefix; the whole
    reference for a fallback), the rest were (the continuation). Sums, so that processes add them up."""
    totals = [0.0, 0.0, 0.0, 0.0]
    for logps, cut in zip(token_logps, unsampled):
        head, tail = list(logps)[:cut], list(logps)[cut:]
        totals[0] += sum(head)
        totals[1] += len(head)
        totals[2] += sum(tail)
        totals[3] += len(tail)
    return totals


def inserted_row_metrics(totals: Sequence[float], inserted_rows: int, batch_rows: int) -> dict[str, float]:
    """The `arg/inserted_*` diagnostics of one step (issue 40 item 4) from the summed `inserted_row_statistics`: the
    share of the batch guidance replaced, the share of the inserted rows' tokens the policy did not sample, and the
    policy's mean log-probability of each kind (a rate without a denominator is absent, not 0). An unsampled token
    has no sampling log-prob, so its vLLM importance weight is 1 by construction, and with `num_iterations=1` every
    token's PPO ratio is 1 as well; what tells the two kinds apart is how unlikely the policy finds them, which
    scales their gradient."""
    unsampled_logp, unsampled, sampled_logp, sampled = totals
    metrics = {"arg/replaced_share": inserted_rows / batch_rows if batch_rows else 0.0}
    if unsampled + sampled:
        metrics["arg/inserted_unsampled_token_share"] = unsampled / (unsampled + sampled)
    if unsampled:
        metrics["arg/inserted_unsampled_logp"] = unsampled_logp / unsampled
    if sampled:
        metrics["arg/inserted_sampled_logp"] = sampled_logp / sampled
    return metrics
