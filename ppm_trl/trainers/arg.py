"""ARGTrainer: GRPO whose all-failure groups receive reference-guided trajectories (ARG paper §4, Alg. 1, App. E).

Algorithm 1's decisions are `ppm_trl/guidance.py` (pure); this file gathers, generates, verifies and replaces rows,
in one hook of the base trainer (`base.py`, the seam with TRL). `on_rollout`: verdicts of the reward functions alone
(gathered) → all-failure groups → ONE batched forward for their reference surprisal → levels from the shared
`PrefixSelector` → ALL continuations of the step in ONE call of the trainer's own backend (`generate_token_ids`: HF,
vLLM colocate or server) → verify → accept (§4.3) → overwrite failed rows in place (vLLM's sampling log-probs for
continuation tokens, None for the unsampled reference prefix); TRL then recomputes masks, log-probs, rewards and
advantages. Every process's outcomes reach every process (one `gather_object`), so the selector is identical on every
rank; it is checkpointed. A group's rows live on one process (checked at construction), and every collective is
called the same number of times on every rank, with dummy rows where a rank has less work.
"""

from __future__ import annotations

import logging

import torch
from accelerate.utils import gather_object

from .. import guidance
from ..configs import ARGConfig
from ..rewards import format_reward
from .base import MethodTrainer, Rollout
from .common import completion_text

logger = logging.getLogger(__name__)

SELECTOR_STATE_FILE = "arg_selector_state.json"


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
        if not reward_funcs:
            raise ValueError("ARGTrainer needs reward functions (`reward_funcs`); the first one is the verifier "
                             "(correct = reward > 0), e.g. `reward_funcs=[accuracy_reward, format_reward]` from "
                             "ppm_trl.rewards")
        funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        if args.reward_weights is None and format_reward in funcs:  # the paper's reward: accuracy + 0.2·format
            args.reward_weights = [args.format_reward_weight if f is format_reward else 1.0 for f in funcs]
        for name in ("rollout_func", "environment_factory", "tools"):
            if kwargs.get(name):
                raise ValueError(f"ARGTrainer supports single-turn text generation only; `{name}` is not supported "
                                 "(PPMGRPOTrainer and PAPOTrainer train on tool and multi-turn rollouts)")
        train_dataset, self.arg_skipped_references = guidance.check_references(
            train_dataset, args.arg_answer_marker, args.arg_skip_invalid_references
        )
        self.guidance_mode = guidance.GuidanceMode(args.arg_mode)  # chosen once
        self.prefix_selector = guidance.PrefixSelector(
            args.arg_levels, args.arg_selector_epsilon, args.arg_selector_lr, args.arg_baseline_rate, args.arg_seed
        )
        self._reference_tokens = {}  # reference text → (token ids, character offsets)
        self._replacement_calls = (None, 0)  # (global step, generations in it): seeds the replacement positions
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
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
        scan = guidance.scan_failures(rewards[:, 0], self.num_generations, self.accelerator.process_index,
                                      self.accelerator.num_processes)
        outcomes = []
        if scan.num_failed:  # the same on every rank: decided on the gathered rewards
            references = [rollout.rows[group.first_row].get("reference") for group in scan.groups]
            plans = self._plan(scan, references, rollout)
            continuations = (self._continue_and_verify(scan.groups, references, plans, rollout)
                             if self.guidance_mode.continues else [[] for _ in plans])
            outcomes = self._accept_and_replace(scan.groups, references, plans, continuations, rollout)
        # One collective per step: every process's outcomes, so the selector steps identically everywhere.
        outcomes = gather_object(outcomes)
        levels, feedback = guidance.selector_feedback(outcomes)
        if self.guidance_mode.adaptive and feedback:  # eq. 12 then eq. 18, b fixed during the batch
            self.prefix_selector.update(levels, feedback)
        for name, value in guidance.guidance_metrics(outcomes, scan, self.guidance_mode, self.prefix_selector).items():
            self.log_metric(name, value)

    def _plan(self, scan: guidance.FailureScan, references: list, rollout: Rollout) -> list[guidance.GroupPlan]:
        """Each local failed group's continuations (Alg. 1 lines 5–8): the mode's fixed plan, or levels from the
        selector and the reference surprisal → snapped prefixes (§4.1, App. E.2)."""
        args, k = self.args, self.args.arg_num_continuations
        plans = [guidance.screen_reference(reference, args.arg_answer_marker, args.arg_skip_invalid_references)
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
            [self._tokenize_reference(reference)[0] for _, reference in usable] + [[self._eos_token_id()]] * padding,
        ))
        budget = guidance.prefix_budget(args.max_completion_length, args.arg_min_continuation_tokens)
        return [plan or guidance.plan_guided_group(
            next(logprobs), levels[group.order * k : (group.order + 1) * k], self.prefix_selector.levels, reference,
            self._tokenize_reference(reference)[1], args.arg_answer_marker, budget,
        ) for group, reference, plan in zip(scan.groups, references, plans)]

    def _continue_and_verify(self, groups, references, plans, rollout: Rollout) -> list[list[tuple]]:
        """All continuations of the step in one generation call (`generate_token_ids`), verified by the reward funcs.
        Per group: [(VerifiedContinuation, (completion ids, decoded completion, sampling log-probs or None))]."""
        budget_total, prompt_ids = self.args.max_completion_length, rollout.prompt_ids
        owners = [(index, prefix, self._tokenize_reference(references[index])[0][: prefix.prefix_len])
                  for index, plan in enumerate(plans) for prefix in plan.prefixes]
        results = [[] for _ in groups]
        num_rows = int(self.accelerator.reduce(torch.tensor(len(owners), device=self.accelerator.device), "max"))
        if num_rows == 0:
            return results
        # Dummy rows (this rank's first row) keep generation and reward gathering symmetric across ranks.
        sources = [groups[index].first_row for index, _, _ in owners] + [0] * (num_rows - len(owners))
        budgets = [budget_total - prefix.prefix_len for _, prefix, _ in owners]
        generated, sampled_logprobs = self.generate_token_ids(
            [list(prompt_ids[row]) + ids for row, (_, _, ids) in zip(sources, owners)]
            + [list(prompt_ids[0])] * (num_rows - len(owners)), budgets, list(prompt_ids[0]))
        # Cutting a row to its own budget is the same distribution as generating with max_new_tokens = budget (prefix +
        # continuation ≤ budget_total); the prefix was not sampled, so it has no log-prob.
        candidates = [prefix + list(ids)[:budget] for (_, _, prefix), ids, budget in zip(owners, generated, budgets)]
        candidates += [list(ids)[:budget_total] for ids in generated[len(owners) :]]
        prompts = [rollout.prompts[row] for row in sources]
        texts = self.decode_completions(prompts, [prompt_ids[row] for row in sources], candidates)
        rewards = self.outcome_rewards([rollout.rows[row] for row in sources], prompts, texts, candidates)  # gathered
        verdict = rewards[self.accelerator.process_index * num_rows :, 0].cpu()
        stop_ids = {*self.eos_ids, self.tokenizer.pad_token_id}
        for row, (index, prefix, prefix_ids) in enumerate(owners):
            ids = candidates[row]
            logprobs = (None if sampled_logprobs is None
                        else [None] * len(prefix_ids) + list(sampled_logprobs[row])[: budgets[row]])
            results[index].append((guidance.VerifiedContinuation(
                prefix, correct=bool(verdict[row] > 0),
                copies_reference=completion_text(texts[row]).strip() == references[index].strip(),
                # A truncated candidate would be masked out of the loss: it cannot fill a slot then.
                trainable=(bool(ids) and ids[-1] in stop_ids) or not self.masks_truncated_completions,
            ), (ids, texts[row], logprobs)))
        return results

    def _accept_and_replace(self, groups, references, plans, continuations, rollout) -> list[guidance.GroupOutcome]:
        """§4.3: accept candidates (else the reference once), each replacing a failure at a uniform position."""
        args, generator = self.args, self._replacement_generator()
        outcomes, inserts = [], []  # inserts: (row, completion ids, decoded completion or None, sampling log-probs)
        for group, reference, plan, verified in zip(groups, references, plans, continuations):
            if plan.status is guidance.GroupStatus.INVALID_REFERENCE:  # skipped, counted
                outcomes.append(guidance.GroupOutcome(group.order, plan.status))
                continue
            reference_ids = self._tokenize_reference(reference)[0] + [self._eos_token_id()]
            outcome = guidance.resolve_group(
                group.order, plan, [continuation for continuation, _ in verified], max_accepted=args.arg_max_accepted,
                max_empty=args.arg_max_empty_prefix, max_guided=args.arg_max_guided,
                falls_back=self.guidance_mode.falls_back_to_reference, surprisal_weighting=args.surprisal_weighting,
                reference_fits=len(reference_ids) <= args.max_completion_length,
            )
            outcomes.append(outcome)
            chosen = [verified[i][1] for i in outcome.accepted] + [(reference_ids, None, None)] * outcome.fallback
            positions = guidance.choose_replacement_rows(self.num_generations, len(chosen), generator)
            inserts += [(group.first_row + position, *insert) for insert, position in zip(chosen, positions)]
        missing = [(row, ids) for row, ids, text, _ in inserts if text is None]
        decoded = dict(zip([row for row, _ in missing], self.decode_completions(
            [rollout.prompts[row] for row, _ in missing], [rollout.prompt_ids[row] for row, _ in missing],
            [ids for _, ids in missing])))
        for row, ids, text, sampled in inserts:
            rollout.completion_ids[row] = ids
            rollout.completions[row] = text if text is not None else decoded[row]
            if rollout.logprobs is not None:  # continuation: vLLM's own; prefix / reference: None → NaN → IS ratio 1
                rollout.logprobs[row] = sampled if sampled is not None else [None] * len(ids)
        return outcomes

    # ---------------------------------------------------------------------------------------------- pieces
    def _tokenize_reference(self, reference: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Reference token ids (no special tokens) and their character offsets, cached per reference text."""
        if reference not in self._reference_tokens:
            encoded = self.tokenizer(reference, add_special_tokens=False, return_offsets_mapping=self.tokenizer.is_fast)
            offsets = encoded.get("offset_mapping") or []
            self._reference_tokens[reference] = (list(encoded["input_ids"]), [tuple(o) for o in offsets])
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
