"""ARGTrainer: GRPO whose all-failure groups receive reference-guided trajectories (ARG paper §4, Alg. 1, App. E).

Algorithm 1's decisions are ARG's pure core (this folder: `surprisal.py`, `prefixes.py`, `selector.py`,
`acceptance.py`, `guidance_step.py`); this file gathers, generates, verifies and replaces rows, in one hook of the
base trainer (`ppm_trl.trainers.base`, the seam with TRL). `on_rollout`: verdicts of the reward functions alone
(gathered) → all-failure groups → ONE batched forward for their reference surprisal → levels from the shared
`PrefixSelector` → ALL continuations of the step in ONE call of the trainer's own backend (`generate_token_ids`: HF,
vLLM colocate or server) → verify → accept (§4.3) → overwrite failed rows in place (vLLM's sampling log-probs for
continuation tokens, None for the unsampled reference prefix); TRL then recomputes masks, log-probs, rewards and
advantages. What passes between those stages is named: `ReferenceTokens`, `PlannedContinuation`, `Trajectory`,
`GeneratedCandidate`, `Replacement` (frozen dataclasses below). Every process's outcomes reach every process (one
`gather_object`), so the selector is identical on every rank; it is checkpointed. A group's rows live on one process (checked at construction), and every collective is
called the same number of times on every rank, with dummy rows where a rank has less work.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object

from ..rewards import format_reward
from ..text import completion_text
from ..trainers.base import MethodTrainer, Rollout
from .acceptance import choose_replacement_rows
from .arg_config import ARGConfig
from .guidance_step import (
    FailedGroup,
    FailureScan,
    GroupOutcome,
    GroupPlan,
    GroupStatus,
    GuidanceMode,
    VerifiedContinuation,
    guidance_metrics,
    inserted_row_metrics,
    inserted_row_statistics,
    plan_guided_group,
    resolve_group,
    scan_failures,
    screen_reference,
    selector_feedback,
)
from .prefixes import GuidedPrefix, prefix_budget
from .references import check_references
from .selector import PrefixSelector

logger = logging.getLogger(__name__)

SELECTOR_STATE_FILE = "arg_selector_state.json"
UNSUPPORTED = ("rollout_func", "environment_factory", "tools")  # GRPOTrainer arguments ARG refuses (after TRL's checks)


@dataclass(frozen=True)
class ReferenceTokens:
    """A reference solution as the tokenizer cuts it (no special tokens)."""

    ids: list[int]
    offsets: list[tuple[int, int]]  # each token's character span in the reference text (for boundary snapping)


@dataclass(frozen=True)
class PlannedContinuation:
    """One continuation to generate: a planned prefix of a failed group's reference."""

    group_index: int  # position among this process's failed groups of the step
    prefix: GuidedPrefix
    prefix_ids: list[int]  # the reference tokens of the prefix, the start of the completion


@dataclass(frozen=True)
class Trajectory:
    """A completion that may replace a failed row: a prefix + continuation, or the reference itself."""

    completion_ids: list[int]
    completion: Any = None  # decoded as TRL decodes its own rows; None: not decoded yet (the reference)
    logprobs: list[float | None] | None = None  # sampling log-probs per token (vLLM; None on the unsampled prefix)


@dataclass(frozen=True)
class GeneratedCandidate:
    """A generated continuation after verification: what acceptance reads, and the trajectory it would insert."""

    verified: VerifiedContinuation
    trajectory: Trajectory


@dataclass(frozen=True)
class Replacement:
    """An accepted trajectory (or the reference) and the failed row of this process it overwrites."""

    row: int
    trajectory: Trajectory
    unsampled: int  # its first tokens the policy did not sample: the reference prefix, or the whole reference


class ARGTrainer(MethodTrainer):
    """GRPO with Adaptive Reference Guidance for all-failure groups (ARG paper §4, Alg. 1, App. E).

    Args:
        Everything is `GRPOTrainer`'s; `args` must be an `ARGConfig` (without it, `ARGConfig("<model name>-ARG")`).
        The train dataset needs a `reference` column (a solution ending in the boxed final answer). The FIRST reward function is the verifier: a row is correct
        when its reward is > 0 (NaN = unscorable); e.g. `reward_funcs=[accuracy_reward, format_reward]` with
        `reward_weights=[1, 0.2]` gives the paper's reward (App. E.3). Text-only, single-turn generation (no tools,
        environments, `rollout_func` or vision inputs).

    Deviations from the paper, each forced by TRL: inserted rows use TRL's ratio π_θ/π_θ_old, which is the paper's
    "stopped current probability" ratio (exactly 1) whenever one policy update follows each generation (the paper's
    setting, and TRL's default); with `num_iterations > 1` they are clipped like ordinary rows. TRL's advantage
    stabiliser is 1e-4 where the paper uses 1e-6 (eq. 28).
    """

    def __init__(self, model, reward_funcs=None, args: ARGConfig | None = None, train_dataset=None, **kwargs):
        if args is None:  # ARGConfig's defaults, as GRPOTrainer builds its own
            args = self.default_config(model)
        if not isinstance(args, ARGConfig):
            raise TypeError(f"ARGTrainer needs an ARGConfig, got {type(args).__name__}")
        local_rows = args.per_device_train_batch_size * args.steps_per_generation
        if local_rows % args.num_generations != 0:
            raise ValueError(
                f"ARG replaces rows of a group on the process that holds it, so every group must live on one process: "
                f"per_device_train_batch_size * steps_per_generation = {local_rows} must be a multiple of "
                f"num_generations = {args.num_generations}"
            )
        # TRL's own argument checks ("No reward source provided", "`train_dataset` is required", environment-owned
        # data without `max_steps`, ...) run first, in `super().__init__`: ARG's refusals of what TRL accepts but ARG
        # cannot train come after it (`_refuse_unsupported`), so TRL's messages stay TRL's.
        funcs = [] if not reward_funcs else reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        if args.reward_weights is None and format_reward in funcs:  # the paper's reward: accuracy + 0.2·format
            # On a copy: the caller's config keeps reward_weights=None (it may build a trainer with other rewards).
            args = copy.copy(args)
            args.reward_weights = [args.format_reward_weight if f is format_reward else 1.0 for f in funcs]
        self.arg_skipped_references = 0
        # Without a dataset or a reward function TRL refuses (or ARG after it), as ARG does multi-turn rollouts.
        if train_dataset is not None and funcs and not any(kwargs.get(name) for name in UNSUPPORTED):
            train_dataset, self.arg_skipped_references = check_references(
                train_dataset, args.arg_answer_marker, args.arg_skip_invalid_references
            )
        self.guidance_mode = GuidanceMode(args.arg_mode)  # chosen once
        self.prefix_selector = PrefixSelector(
            args.arg_levels, args.arg_selector_epsilon, args.arg_selector_lr, args.arg_baseline_rate, args.arg_seed
        )
        self._reference_tokens: dict[str, ReferenceTokens] = {}  # by reference text
        self._replacement_calls = (None, 0)  # (global step, generations in it): seeds the replacement positions
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        _refuse_unsupported(funcs, kwargs)
        if self.is_multimodal:
            raise ValueError("ARGTrainer supports text-only models; got a multimodal processor")
        if self.guidance_mode.adaptive and not getattr(self.tokenizer, "is_fast", False):
            raise ValueError("ARG snaps prefixes with the tokenizer's offset_mapping, which needs a fast tokenizer")

    # ------------------------------------------------------------------------------------------ base hooks
    def on_rollout(self, rollout: Rollout) -> Rollout:
        rollout = super().on_rollout(rollout)
        if self.model.training:  # evaluation: no guidance (paper App. E.4)
            self._guide_failed_groups(rollout)
        return rollout

    def extra_checkpoint_state(self) -> dict:
        return {**super().extra_checkpoint_state(), SELECTOR_STATE_FILE: self.prefix_selector.state_dict()}

    def load_extra_checkpoint_state(self, states: dict) -> None:
        super().load_extra_checkpoint_state(states)
        if SELECTOR_STATE_FILE not in states:
            logger.warning("ARG: the checkpoint has no %s; the prefix selector starts fresh", SELECTOR_STATE_FILE)
            return
        self.prefix_selector.load_state_dict(states[SELECTOR_STATE_FILE])

    # ------------------------------------------------------------------------------------------ Algorithm 1
    def _guide_failed_groups(self, rollout: Rollout) -> None:
        """Alg. 1 lines 4–18 for this generation batch; overwrites failed rows of the rollout in place."""
        # The reward functions alone: a composed trainer's PPM progress or PAPO process scores would spend judge calls
        # on rows that guidance only needs verdicts for.
        rewards = self.outcome_rewards(rollout.rows, rollout.prompts, rollout.completions, rollout.completion_ids)
        scan = scan_failures(rewards[:, 0], self.num_generations, self.accelerator.process_index,
                             self.accelerator.num_processes)
        outcomes, replacements = [], []
        if scan.num_failed:  # the same on every rank: decided on the gathered rewards
            references = [rollout.rows[group.first_row].get("reference") for group in scan.groups]
            plans = self._plan(scan, references, rollout)
            continuations = (self._continue_and_verify(scan.groups, references, plans, rollout)
                             if self.guidance_mode.continues else [[] for _ in plans])
            outcomes, replacements = self._accept_and_replace(scan.groups, references, plans, continuations, rollout)
        self._log_inserted_rows(rollout, replacements)
        # One collective per step: every process's outcomes, so the selector steps identically everywhere.
        outcomes = gather_object(outcomes)
        levels, feedback = selector_feedback(outcomes)
        if self.guidance_mode.adaptive and feedback:  # eq. 12 then eq. 18, b fixed during the batch
            self.prefix_selector.update(levels, feedback)
        for name, value in guidance_metrics(outcomes, scan, self.guidance_mode, self.prefix_selector).items():
            self.log_metric(name, value)

    def _plan(self, scan: FailureScan, references: list, rollout: Rollout) -> list[GroupPlan]:
        """Each local failed group's continuations (Alg. 1 lines 5–8): the mode's fixed plan, or levels from the
        selector and the reference surprisal → snapped prefixes (§4.1, App. E.2)."""
        args, k = self.args, self.args.arg_num_continuations
        plans = [screen_reference(reference, args.arg_answer_marker, args.arg_skip_invalid_references)
                 for reference in references]  # None: the reference can guide
        if not self.guidance_mode.adaptive:
            return [plan or self.guidance_mode.fixed_plan(k) for plan in plans]
        # Every rank draws levels for every failed group of the step, so the selector's generator stays in sync.
        levels = self.prefix_selector.sample(k * scan.num_failed)
        usable = [(group, reference) for group, reference, plan in zip(scan.groups, references, plans) if not plan]
        # One batched no-grad forward, padded with dummy rows to the most failed groups a rank holds: every rank runs
        # the same number of forward chunks (ZeRO-3 gathers parameters inside each).
        padding = scan.max_local - len(usable)
        logprobs = iter(self.sequence_logprobs(
            [rollout.prompt_ids[group.first_row] for group, _ in usable] + [rollout.prompt_ids[0]] * padding,
            [self._tokenize_reference(reference).ids for _, reference in usable] + [[self._eos_token_id()]] * padding,
        ))
        budget = prefix_budget(args.max_completion_length, args.arg_min_continuation_tokens)
        return [plan or plan_guided_group(
            next(logprobs), levels[group.order * k : (group.order + 1) * k], self.prefix_selector.levels, reference,
            self._tokenize_reference(reference).offsets, args.arg_answer_marker, budget,
        ) for group, reference, plan in zip(scan.groups, references, plans)]

    def _continue_and_verify(self, groups: list[FailedGroup], references: list, plans: list[GroupPlan],
                             rollout: Rollout) -> list[list[GeneratedCandidate]]:
        """All continuations of the step in one generation call (`generate_token_ids`), verified by the reward funcs;
        per group, its candidates in plan order."""
        budget_total, prompt_ids = self.args.max_completion_length, rollout.prompt_ids
        planned = [PlannedContinuation(index, prefix,
                                       self._tokenize_reference(references[index]).ids[: prefix.prefix_len])
                   for index, plan in enumerate(plans) for prefix in plan.prefixes]
        results = [[] for _ in groups]
        num_rows = int(self.accelerator.reduce(torch.tensor(len(planned), device=self.accelerator.device), "max"))
        if num_rows == 0:
            return results
        # Dummy rows (this rank's first row) keep generation and reward gathering symmetric across ranks.
        sources = [groups[p.group_index].first_row for p in planned] + [0] * (num_rows - len(planned))
        budgets = [budget_total - p.prefix.prefix_len for p in planned]
        generated, sampled_logprobs = self.generate_token_ids(
            [list(prompt_ids[row]) + p.prefix_ids for row, p in zip(sources, planned)]
            + [list(prompt_ids[0])] * (num_rows - len(planned)), budgets, list(prompt_ids[0]))
        # Cutting a row to its own budget is the same distribution as generating with max_new_tokens = budget (prefix +
        # continuation ≤ budget_total); the prefix was not sampled, so it has no log-prob.
        candidates = [p.prefix_ids + list(ids)[:budget] for p, ids, budget in zip(planned, generated, budgets)]
        candidates += [list(ids)[:budget_total] for ids in generated[len(planned) :]]
        prompts = [rollout.prompts[row] for row in sources]
        texts = self.decode_completions(prompts, [prompt_ids[row] for row in sources], candidates)
        rewards = self.outcome_rewards([rollout.rows[row] for row in sources], prompts, texts, candidates)  # gathered
        verdict = rewards[self.local_rows(num_rows), 0].cpu()
        stop_ids = {*self.eos_ids, self.tokenizer.pad_token_id}
        for row, p in enumerate(planned):
            ids = candidates[row]
            logprobs = (None if sampled_logprobs is None
                        else [None] * len(p.prefix_ids) + list(sampled_logprobs[row])[: budgets[row]])
            results[p.group_index].append(GeneratedCandidate(VerifiedContinuation(
                p.prefix, correct=bool(verdict[row] > 0),
                copies_reference=completion_text(texts[row]).strip() == references[p.group_index].strip(),
                # A truncated candidate would be masked out of the loss: it cannot fill a slot then.
                trainable=(bool(ids) and ids[-1] in stop_ids) or not self.masks_truncated_completions,
            ), Trajectory(ids, texts[row], logprobs)))
        return results

    def _accept_and_replace(self, groups: list[FailedGroup], references: list, plans: list[GroupPlan],
                            continuations: list[list[GeneratedCandidate]],
                            rollout: Rollout) -> tuple[list[GroupOutcome], list[Replacement]]:
        """§4.3: accept candidates (else the reference once), each replacing a failure at a uniform position."""
        args, generator = self.args, self._replacement_generator()
        outcomes, replacements = [], []
        for group, reference, plan, candidates in zip(groups, references, plans, continuations):
            if plan.status is GroupStatus.INVALID_REFERENCE:  # skipped, counted
                outcomes.append(GroupOutcome(group.order, plan.status))
                continue
            reference_ids = self._tokenize_reference(reference).ids + [self._eos_token_id()]
            outcome = resolve_group(
                group.order, plan, [candidate.verified for candidate in candidates],
                max_accepted=args.arg_max_accepted, max_empty=args.arg_max_empty_prefix,
                max_guided=args.arg_max_guided, falls_back=self.guidance_mode.falls_back_to_reference,
                surprisal_weighting=args.surprisal_weighting,
                reference_fits=len(reference_ids) <= args.max_completion_length,
            )
            outcomes.append(outcome)
            chosen = [(candidates[i].trajectory, candidates[i].verified.prefix.prefix_len) for i in outcome.accepted]
            chosen += [(Trajectory(reference_ids), len(reference_ids))] * outcome.fallback
            positions = choose_replacement_rows(self.num_generations, len(chosen), generator)
            replacements += [Replacement(group.first_row + position, trajectory, unsampled)
                             for (trajectory, unsampled), position in zip(chosen, positions)]
        undecoded = [r for r in replacements if r.trajectory.completion is None]
        decoded = dict(zip([r.row for r in undecoded], self.decode_completions(
            [rollout.prompts[r.row] for r in undecoded], [rollout.prompt_ids[r.row] for r in undecoded],
            [r.trajectory.completion_ids for r in undecoded])))
        for row, trajectory in ((r.row, r.trajectory) for r in replacements):
            rollout.completion_ids[row] = trajectory.completion_ids
            rollout.completions[row] = trajectory.completion if trajectory.completion is not None else decoded[row]
            if rollout.logprobs is not None:  # continuation: vLLM's own; prefix / reference: None → NaN → IS ratio 1
                rollout.logprobs[row] = (trajectory.logprobs if trajectory.logprobs is not None
                                         else [None] * len(trajectory.completion_ids))
        return outcomes, replacements

    def _log_inserted_rows(self, rollout: Rollout, replacements: list[Replacement]) -> None:
        """`inserted_row_metrics` over every process: one no-grad forward of the inserted rows, padded with dummy rows
        to the most a rank inserted (every rank runs the same forward chunks; ZeRO-3 gathers parameters in each)."""
        device = self.accelerator.device
        most = int(self.accelerator.reduce(torch.tensor(len(replacements), device=device), "max"))
        totals = [0.0, 0.0, 0.0, 0.0]
        if most:
            padding = most - len(replacements)
            logps = self.sequence_logprobs(
                [rollout.prompt_ids[r.row] for r in replacements] + [rollout.prompt_ids[0]] * padding,
                [r.trajectory.completion_ids for r in replacements] + [[self._eos_token_id()]] * padding)
            totals = inserted_row_statistics([lp.tolist() for lp in logps[: len(replacements)]],
                                             [r.unsampled for r in replacements])
        local = torch.tensor([*totals, len(replacements), len(rollout.completion_ids)], dtype=torch.float64,
                             device=device)
        summed = self.accelerator.reduce(local, "sum").tolist()
        for name, value in inserted_row_metrics(summed[:4], int(summed[4]), int(summed[5])).items():
            self.log_metric(name, value)

    # ---------------------------------------------------------------------------------------------- pieces
    def _tokenize_reference(self, reference: str) -> ReferenceTokens:
        """The reference's tokens (no special tokens) and their character offsets, cached per reference text."""
        if reference not in self._reference_tokens:
            encoded = self.tokenizer(reference, add_special_tokens=False, return_offsets_mapping=self.tokenizer.is_fast)
            offsets = encoded.get("offset_mapping") or []
            self._reference_tokens[reference] = ReferenceTokens(list(encoded["input_ids"]), [tuple(o) for o in offsets])
        return self._reference_tokens[reference]

    def _eos_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return eos if eos in self.eos_ids else self.eos_ids[0]

    def _replacement_generator(self) -> torch.Generator:
        """Per-rank generator for the uniform replacement positions, reproducible across resumes (no saved state)."""
        step, calls = self._replacement_calls
        calls = calls + 1 if step == self.state.global_step else 0
        self._replacement_calls = (self.state.global_step, calls)
        seed = ((self.args.arg_seed * 1_000_003 + self.state.global_step) * 1_009 + calls) * 131
        return torch.Generator().manual_seed(seed + self.accelerator.process_index)


def _refuse_unsupported(reward_funcs: list, kwargs: dict) -> None:
    """What GRPOTrainer accepted (its checks ran) but ARG cannot train: multi-turn or custom rollouts, and a run whose
    only reward is an environment's (ARG's verifier is its first reward function)."""
    for name in UNSUPPORTED:
        if kwargs.get(name):
            raise ValueError(f"ARGTrainer supports single-turn text generation only; `{name}` is not supported "
                             "(PPMGRPOTrainer and PAPOTrainer train on tool and multi-turn rollouts)")
    if not reward_funcs:
        raise ValueError("ARGTrainer needs reward functions (`reward_funcs`); the first one is the verifier "
                         "(correct = reward > 0), e.g. `reward_funcs=[accuracy_reward, format_reward]` from "
                         "ppm_trl.rewards")
