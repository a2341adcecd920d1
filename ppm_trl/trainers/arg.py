"""ARGTrainer: GRPO whose all-failure groups receive reference-guided trajectories (ARG paper §4, Alg. 1, App. E).

One hook of the base trainer (`base.py`, the seam with TRL): `on_rollout`, after TRL generated the groups, scores them
with the trainer's reward functions alone (`outcome_rewards`, gathered), finds the all-failure groups, runs ONE
batched forward pass for the reference surprisal of all of them (`sequence_logprobs`), draws guidance levels from the
shared `PrefixSelector`, generates ALL continuations of the step in ONE call of the trainer's own backend
(`generate_token_ids`: HF generate, vLLM colocate or server), verifies them, accepts (§4.3) and overwrites failed rows
in place, with vLLM's sampling log-probs for the continuation tokens (None for the reference prefix, which was not
sampled). The base then logs TRL's completion statistics of the final rows; TRL recomputes masks, log-probs,
rewards and advantages. The selector is updated from gathered feedback, so it is identical on every rank, and is
saved with every checkpoint (`extra_checkpoint_state`).

Multi-process: all-failure is decided on the gathered rewards; a group's rows must live on one process (checked at
construction); every collective (reward gather, surprisal forward chunks, generation, feedback reduce) is called the
same number of times on every rank, with dummy rows where a rank has less work.
"""

from __future__ import annotations

import logging
import textwrap
from dataclasses import dataclass, field

import torch

from ..guidance import (
    Candidate,
    PrefixSelector,
    accept_candidates,
    choose_replacement_rows,
    continuation_feedback,
    mean_feedback_per_level,
    plan_reference_prefixes,
    prefix_budget,
)
from ..configs import ARGConfig
from ..rewards import last_boxed
from .base import MethodTrainer, Rollout
from .common import check_reward_columns, completion_text, resolve_model_path

logger = logging.getLogger(__name__)

SELECTOR_STATE_FILE = "arg_selector_state.json"


def reference_problem(reference, answer_marker: str = "\\boxed") -> str | None:
    """Why `reference` cannot guide (None when it can): it must be a non-empty string ending in a final answer."""
    if not isinstance(reference, str) or not reference.strip():
        return f"expected a non-empty reference solution string, got {reference!r:.80}"
    if answer_marker not in reference:
        return f"the reference has no final answer marker {answer_marker!r} (App. E.1 drops such references)"
    if answer_marker == "\\boxed":
        boxed = last_boxed(reference)
        if boxed is None or not boxed.strip():
            return "the reference's last \\boxed{...} is unclosed or empty; it must end in the boxed final answer"
    return None


def check_references(dataset, answer_marker: str, skip_invalid: bool):
    """The dataset, validated for ARG; with `skip_invalid` the invalid rows are dropped (returns dataset, count).

    A missing `reference` column, or (without `skip_invalid`) a bad row, is a ValueError naming the row. Iterable
    datasets are checked row by row during training instead.
    """
    if dataset is None:
        raise ValueError("ARGTrainer needs a train_dataset with a `reference` column")
    if isinstance(dataset, dict):
        raise ValueError("ARGTrainer trains on one dataset; pass a single split as train_dataset, not a dict")
    columns = getattr(dataset, "column_names", None) or []
    if "reference" not in columns:
        raise ValueError(
            f"ARG needs a `reference` column (a reference solution ending in {answer_marker}{{answer}}) in the "
            f"dataset; found columns {sorted(columns)}"
        )
    if not hasattr(dataset, "__len__"):
        return dataset, 0
    bad = []
    for row, reference in enumerate(dataset["reference"]):
        problem = reference_problem(reference, answer_marker)
        if problem is not None:
            if not skip_invalid:
                raise ValueError(
                    f"ARG: column `reference`, row {row}: {problem}. Fix the row or set "
                    "arg_skip_invalid_references=True to skip such rows (counted)."
                )
            bad.append(row)
    if not bad:
        return dataset, 0
    if len(bad) == len(dataset):
        raise ValueError(f"ARG: all {len(bad)} rows have an invalid `reference`; nothing left to train on")
    logger.warning(
        "ARG: skipping %d of %d rows with an invalid `reference` (first rows: %s)", len(bad), len(dataset), bad[:10]
    )
    keep = sorted(set(range(len(dataset))) - set(bad))
    return dataset.select(keep), len(bad)


@dataclass
class _FailedGroup:
    """One all-failure group of this process and what guidance did for it."""

    order: int  # position among the step's all-failure groups, in global order (same on every rank)
    first_row: int  # local row index of the group's first row
    reference: str
    status: str = "fallback_only"  # guided | fallback_only | degenerate_surprisal | invalid_reference
    levels: list[float] = field(default_factory=list)  # one per continuation
    prefix_lens: list[int] = field(default_factory=list)
    surprisal_ratios: list[float] = field(default_factory=list)  # S_t/S_0 at each continuation's cut
    collapsed: list[bool] = field(default_factory=list)  # an α < 1 level whose adjusted prefix is empty (counted)
    candidates: list[list[int]] = field(default_factory=list)  # completion ids: prefix + continuation
    candidate_texts: list = field(default_factory=list)  # decoded like TRL's completions
    candidate_logprobs: list = field(default_factory=list)  # vLLM sampling log-prob per token (None: prefix / HF)
    correct: list[bool] = field(default_factory=list)
    copies_reference: list[bool] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    fallback: bool = False
    fallback_too_long: bool = False


class ARGTrainer(MethodTrainer):
    """GRPO with Adaptive Reference Guidance for all-failure groups (ARG paper §4, Alg. 1, App. E).

    Args:
        Everything is `GRPOTrainer`'s; `args` must be an `ARGConfig`. The train dataset needs a `reference` column
        (a solution ending in the boxed final answer). The FIRST reward function is the verifier: a row is correct
        when its reward is > 0 (NaN = unscorable); e.g. `reward_funcs=[accuracy_reward, format_reward]` with
        `reward_weights=[1, 0.2]` gives the paper's reward (App. E.3). Text-only, single-turn generation (no tools,
        environments, `rollout_func` or vision inputs).

    Deviations from the paper, each forced by TRL: inserted rows use TRL's ratio π_θ/π_θ_old, which is the paper's
    "stopped current probability" ratio (exactly 1) whenever one policy update follows each generation (the paper's
    setting, and TRL's default); with `num_iterations > 1` they are clipped like ordinary rows. TRL's advantage
    stabiliser is 1e-4 where the paper uses 1e-6 (eq. 28).
    """

    _tag_names = ["trl", "grpo", "arg", "ppm-trl"]
    _name = "ARG"
    _paper = {
        "title": "Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning RL",
        "id": "2610.11128",
        "citation": textwrap.dedent(
            """\
            @article{wang2026balancing,
                title        = {{Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning RL}},
                author       = {Hanyu Wang and Nakul Agarwal and Hossein Nourkhiz Mahjoub and Ehsan Moradi Pari and Makoto Fukushima and Jinghui Chen and Vaishnav Tadiparthi},
                year         = 2026,
                eprint       = {arXiv:2610.11128}
            }"""
        ),
    }

    def __init__(self, model, reward_funcs, args: ARGConfig | None = None, train_dataset=None, **kwargs):
        if args is None:
            raise ValueError("ARGTrainer needs an ARGConfig (`args=ARGConfig(...)`)")
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
            raise ValueError("ARGTrainer needs reward functions; the first one is the verifier (correct = reward > 0)")
        for name in ("rollout_func", "environment_factory", "tools"):
            if kwargs.get(name):
                raise ValueError(f"ARGTrainer supports single-turn text generation only; `{name}` is not supported")
        train_dataset, self.arg_skipped_references = check_references(
            train_dataset, args.arg_answer_marker, args.arg_skip_invalid_references
        )
        self.prefix_selector = PrefixSelector(
            args.arg_levels, args.arg_selector_epsilon, args.arg_selector_lr, args.arg_baseline_rate, args.arg_seed
        )
        self._reference_tokens = {}  # reference text → (token ids, character offsets)
        self._replacement_calls = (None, 0)  # (global step, generations in it): seeds the replacement positions
        check_reward_columns(train_dataset, reward_funcs, "ARG")
        model = resolve_model_path(model, args)  # "tiny", or a local directory made absolute
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        if self.is_multimodal:
            raise ValueError("ARGTrainer supports text-only models; got a multimodal processor")
        if args.arg_mode == "arg" and not getattr(self.tokenizer, "is_fast", False):
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
        args, group_size = self.args, self.num_generations
        inputs, prompts, prompt_ids = rollout.rows, rollout.prompts, rollout.prompt_ids
        # The reward functions alone: a composed trainer's PPM progress or PAPO process scores would spend judge calls
        # on rows that guidance only needs verdicts for.
        rewards = self.outcome_rewards(inputs, prompts, rollout.completions, rollout.completion_ids)
        verdict = rewards[:, 0]
        scored = ~torch.isnan(verdict)
        failed = (scored & (verdict <= 0)).view(-1, group_size).all(dim=1)  # every row scored and incorrect
        unscorable = (~scored).view(-1, group_size).any(dim=1) & ~(verdict > 0).view(-1, group_size).any(dim=1)
        groups_per_rank = len(prompts) // group_size
        first_group = self.accelerator.process_index * groups_per_rank
        failed_ids = failed.nonzero().flatten().tolist()
        groups = []
        for order, group_index in enumerate(failed_ids):
            if first_group <= group_index < first_group + groups_per_rank:
                first_row = (group_index - first_group) * group_size
                groups.append(_FailedGroup(order, first_row, inputs[first_row].get("reference")))
        for group in groups:
            if reference_problem(group.reference, args.arg_answer_marker) is not None:
                if not args.arg_skip_invalid_references:
                    raise ValueError(
                        f"ARG: reference {group.reference!r:.80} of a training row is invalid: "
                        f"{reference_problem(group.reference, args.arg_answer_marker)}"
                    )
                group.status = "invalid_reference"
        if failed_ids:  # the same on every rank: decided on the gathered rewards
            max_local_groups = int(failed.view(-1, groups_per_rank).sum(dim=1).max())
            if args.arg_mode == "arg":
                self._plan_guided_prefixes(groups, prompt_ids, len(failed_ids), max_local_groups)
            elif args.arg_mode == "resampling":
                for group in groups:
                    if group.status != "invalid_reference":
                        group.status = "guided"
                        group.levels = [1.0] * args.arg_num_continuations
                        group.prefix_lens = [0] * args.arg_num_continuations
                        group.surprisal_ratios = [1.0] * args.arg_num_continuations
                        group.collapsed = [False] * args.arg_num_continuations
            if args.arg_mode != "reference_insertion":
                self._continue_and_verify(groups, inputs, prompts, prompt_ids)
            self._accept_and_replace(groups, prompts, prompt_ids, rollout.completion_ids, rollout.completions,
                                     rollout.logprobs)
        self._update_selector_and_log(groups, len(failed_ids), int(unscorable.sum()))

    def _plan_guided_prefixes(self, groups, prompt_ids, num_failed: int, max_local_groups: int) -> None:
        """Reference surprisal (one forward pass) → K levels from the selector → snapped prefixes (§4.1, E.2)."""
        args = self.args
        k = args.arg_num_continuations
        # Every rank draws levels for every failed group of the step, so the selector's generator stays in sync.
        levels = self.prefix_selector.sample(k * num_failed)
        usable = [g for g in groups if g.status != "invalid_reference"]
        references = [self._tokenize_reference(g.reference) for g in usable]
        logprobs = self._reference_logprobs(
            [prompt_ids[g.first_row] for g in usable], [ids for ids, _ in references], prompt_ids[0], max_local_groups
        )
        budget = prefix_budget(args.max_completion_length, args.arg_min_continuation_tokens)
        for group, (_, offsets), token_logprobs in zip(usable, references, logprobs):
            total = -float(token_logprobs.sum())
            if not 0.0 < total < float("inf"):  # Alg. 1 line 6: no continuations, reference fallback
                group.status = "degenerate_surprisal"
                continue
            plan = plan_reference_prefixes(
                token_logprobs, self.prefix_selector.levels, group.reference, offsets, args.arg_answer_marker, budget
            )
            group.status = "guided"
            group.levels = levels[group.order * k : (group.order + 1) * k]
            group.prefix_lens = [plan[level].prefix_len for level in group.levels]
            group.surprisal_ratios = [plan[level].surprisal_ratio for level in group.levels]
            # A reference whose valid cuts all lie past the budget: α < 1 then continues from the empty prefix
            # (App. E.2: "or the empty prefix if there is none"). That is t_x(α), so the continuation is credited to
            # the sampled α with W at the adjusted prefix (S_0/S_0 = 1; eq. 12, App. H.1); counted as collapsed.
            group.collapsed = [level < 1 and plan[level].prefix_len == 0 for level in group.levels]

    def _continue_and_verify(self, groups, inputs, prompts, prompt_ids) -> None:
        """All continuations of the step in one generation call (`generate_token_ids`), verified by the reward funcs."""
        budget_total = self.args.max_completion_length
        rows, owners = [], []  # generation prompts and (group, prefix ids, budget) per row
        for group in groups:
            if group.status != "guided":
                continue
            reference_ids = self._tokenize_reference(group.reference)[0]
            for prefix_len in group.prefix_lens:
                prefix = reference_ids[:prefix_len]
                rows.append(list(prompt_ids[group.first_row]) + prefix)
                owners.append((group, prefix, budget_total - prefix_len))
        device = self.accelerator.device
        num_rows = int(self.accelerator.reduce(torch.tensor(len(rows), device=device), reduction="max"))
        if num_rows == 0:
            return
        # Dummy rows (this rank's first prompt) keep generation and reward gathering symmetric across ranks.
        rows += [list(prompt_ids[0])] * (num_rows - len(rows))
        budgets = [budget for _, _, budget in owners]
        generated, sampled_logprobs = self.generate_token_ids(rows, budgets, list(prompt_ids[0]))
        candidate_ids, candidate_logprobs, row_prompts, row_inputs, row_prompt_ids = [], [], [], [], []
        for index, ids in enumerate(generated):
            ids = list(ids)
            if index < len(owners):
                group, prefix, budget = owners[index]
                # Cutting a row to its own budget is the same distribution as generating with max_new_tokens =
                # budget (prefix + continuation ≤ budget_total); the prefix was not sampled, so it has no log-prob.
                candidate_ids.append(prefix + ids[:budget])
                if sampled_logprobs is not None:
                    candidate_logprobs.append([None] * len(prefix) + list(sampled_logprobs[index])[:budget])
                row = group.first_row
            else:
                candidate_ids.append(ids[:budget_total])
                row = 0
            row_prompts.append(prompts[row])
            row_inputs.append(inputs[row])
            row_prompt_ids.append(prompt_ids[row])
        texts = self.decode_completions(row_prompts, row_prompt_ids, candidate_ids)
        rewards = self.outcome_rewards(row_inputs, row_prompts, texts, candidate_ids)  # collective, gathered
        start = self.accelerator.process_index * num_rows
        verdict = rewards[start : start + num_rows, 0].cpu()
        stop_ids = {*self.eos_token_ids, self.tokenizer.pad_token_id}
        for index, (group, _, _) in enumerate(owners):
            group.candidates.append(candidate_ids[index])
            group.candidate_texts.append(texts[index])
            group.candidate_logprobs.append(candidate_logprobs[index] if candidate_logprobs else None)
            group.correct.append(bool(verdict[index] > 0))
            group.copies_reference.append(completion_text(texts[index]).strip() == group.reference.strip())
            group.terminated.append(bool(candidate_ids[index]) and candidate_ids[index][-1] in stop_ids)

    def _accept_and_replace(self, groups, prompts, prompt_ids, completion_ids, completions, logprobs) -> None:
        """§4.3: accept candidates (else the reference once), each replacing a failure at a uniform position."""
        args = self.args
        generator = self._replacement_generator()
        inserts = []  # (row, completion ids, decoded completion or None for the fallback, sampling log-probs)
        for group in groups:
            if group.status == "invalid_reference":
                continue
            candidates = [
                # A truncated candidate would be masked out of the loss: it cannot fill a slot then.
                Candidate(correct and (done or not self.mask_truncated_completions), copy, prefix_len)
                for correct, copy, done, prefix_len in zip(
                    group.correct, group.copies_reference, group.terminated, group.prefix_lens
                )
            ]
            group.accepted = accept_candidates(
                candidates, args.arg_max_accepted, args.arg_max_empty_prefix, args.arg_max_guided
            )
            chosen = [(group.candidates[i], group.candidate_texts[i], group.candidate_logprobs[i])
                      for i in group.accepted]
            if not chosen and args.arg_mode != "resampling":
                reference_ids = self._tokenize_reference(group.reference)[0] + [self._eos_token_id()]
                if len(reference_ids) <= args.max_completion_length:
                    group.fallback = True
                    chosen = [(reference_ids, None, None)]
                else:  # inserting it cut would lose its boxed answer: skip, counted
                    group.fallback_too_long = True
            positions = choose_replacement_rows(self.num_generations, len(chosen), generator)
            inserts += [(group.first_row + position, *insert) for insert, position in zip(chosen, positions)]
        if not inserts:
            return
        missing = [(row, ids) for row, ids, text, _ in inserts if text is None]
        decoded = self.decode_completions([prompts[row] for row, _ in missing], [prompt_ids[row] for row, _ in missing],
                               [ids for _, ids in missing])
        decoded_by_row = {row: text for (row, _), text in zip(missing, decoded)}
        for row, ids, text, sampled in inserts:
            completion_ids[row] = ids
            completions[row] = text if text is not None else decoded_by_row[row]
            if logprobs is not None:  # continuation: vLLM's own; prefix / reference: None → NaN → IS ratio 1
                logprobs[row] = sampled if sampled is not None else [None] * len(ids)

    def _update_selector_and_log(self, groups, num_failed: int, num_unscorable: int) -> None:
        """Gather every continuation's feedback (one reduce), update the selector identically on every rank, log."""
        args, k = self.args, self.args.arg_num_continuations
        levels_all = list(self.prefix_selector.levels)
        if args.arg_mode == "resampling" and 1.0 not in levels_all:
            levels_all.append(1.0)  # resampling continues from the empty prefix only, whatever the selector's levels
        # Per failed group: [W_1..W_K | has_1..K | success_1..K | accepted_1..K | level index_1..K | collapsed_1..K |
        # correct_1..K | copy_1..K | counters]; collapsed = an α < 1 level whose adjusted prefix is empty (credited to
        # α like any continuation, eq. 12; only counted); success = correct and not a byte copy of the reference.
        counters = ("guided", "fallback", "fallback_too_long", "degenerate_surprisal", "invalid_reference", "inserted")
        width = 8 * k + len(counters)
        table = torch.zeros(max(num_failed, 1), width, dtype=torch.float32, device=self.accelerator.device)
        for group in groups:
            row = table[group.order]
            for j, level in enumerate(group.levels[: len(group.correct)]):
                success = group.correct[j] and not group.copies_reference[j]
                row[j] = continuation_feedback(
                    group.correct[j], group.copies_reference[j], group.surprisal_ratios[j], args.surprisal_weighting
                )
                row[k + j], row[2 * k + j] = 1.0, float(success)
                row[3 * k + j] = float(j in group.accepted)
                row[4 * k + j] = levels_all.index(level)
                row[5 * k + j] = float(group.collapsed[j])
                row[6 * k + j] = float(group.correct[j])
                row[7 * k + j] = float(group.copies_reference[j])
            flags = (group.status == "guided", group.fallback, group.fallback_too_long,
                     group.status == "degenerate_surprisal", group.status == "invalid_reference",
                     len(group.accepted) + int(group.fallback))
            row[8 * k :] = torch.tensor(flags, dtype=torch.float32)
        table = self.accelerator.reduce(table, reduction="sum").cpu()[:num_failed]  # one collective per step

        # Every continuation of the step enters the update with its sampled level α_j and W at its adjusted prefix
        # (§4.2: "every continuation provides the selector feedback"; App. E.2, H.1), including α < 1 levels whose
        # prefix is empty: dropping them would bias eq. 12 against levels that often collapse.
        has = table[:, k : 2 * k] > 0
        collapsed = has & (table[:, 5 * k : 6 * k] > 0)
        levels = [levels_all[int(i)] for i in table[:, 4 * k : 5 * k][has].tolist()]
        feedback = table[:, :k][has].tolist()
        if args.arg_mode == "arg" and feedback:  # eq. 12 then eq. 18, b fixed during the batch
            self.prefix_selector.update(levels, feedback)

        totals = dict(zip(counters, table[:, 8 * k :].sum(dim=0).tolist()))
        accepted_groups = int(((table[:, 3 * k : 4 * k] * table[:, k : 2 * k]).sum(dim=1) > 0).sum())
        self.log_metric("arg/all_failure_groups", num_failed)
        self.log_metric("arg/unscorable_groups", num_unscorable)
        self.log_metric("arg/guided_groups", totals["guided"])
        self.log_metric("arg/groups_with_accepted", accepted_groups)
        # App. G.2's rescue rate: all-failure groups that accept a candidate trajectory (reference fallback excluded).
        if num_failed:  # a step without all-failure groups has no rate (not 0)
            self.log_metric("arg/rescue_rate", accepted_groups / num_failed)
        self.log_metric("arg/fallback_groups", totals["fallback"])
        self.log_metric("arg/fallback_too_long", totals["fallback_too_long"])
        self.log_metric("arg/degenerate_surprisal_groups", totals["degenerate_surprisal"])
        self.log_metric("arg/invalid_reference_groups", totals["invalid_reference"])
        self.log_metric("arg/inserted_rows", totals["inserted"])
        self.log_metric("arg/continuations", int(has.sum()))
        self.log_metric("arg/collapsed_levels", int(collapsed.sum()))
        success = table[:, 2 * k : 3 * k][has].tolist()
        accepted = table[:, 3 * k : 4 * k][has].tolist()
        correct = table[:, 6 * k : 7 * k][has].tolist()
        copies = table[:, 7 * k : 8 * k][has].tolist()
        mean_feedback = mean_feedback_per_level(levels, feedback, levels_all)
        for level in levels_all:
            picked = [i for i, value in enumerate(levels) if value == level]
            name = f"alpha_{level:g}"
            if picked:  # a level without continuations this step has no rate (not 0)
                # correct_rate counts byte copies of the reference; success_rate (eq. 4's d_t) does not.
                self.log_metric(f"arg/correct_rate/{name}", sum(correct[i] for i in picked) / len(picked))
                self.log_metric(f"arg/copy_rate/{name}", sum(copies[i] for i in picked) / len(picked))
                self.log_metric(f"arg/success_rate/{name}", sum(success[i] for i in picked) / len(picked))
                self.log_metric(f"arg/acceptance_rate/{name}", sum(accepted[i] for i in picked) / len(picked))
                self.log_metric(f"arg/mean_feedback/{name}", mean_feedback[level])
        for level, prob in zip(levels_all, self.prefix_selector.probs().tolist()):
            self.log_metric(f"arg/selector_prob/alpha_{level:g}", prob)
        self.log_metric("arg/selector_baseline", self.prefix_selector.baseline)

    # ---------------------------------------------------------------------------------------------- pieces
    def _reference_logprobs(self, prompt_ids, reference_ids, dummy_prompt, num_rows: int) -> list[torch.Tensor]:
        """Per-token log π(r_j | x, r_<j) of each (prompt ids, reference ids) row: one batched no-grad forward.

        Padded with dummy rows to `num_rows` (the most failed groups any rank holds), so that every rank runs the
        same number of forward chunks (ZeRO-3 gathers parameters inside each).
        """
        if num_rows == 0:
            return []
        padding = num_rows - len(prompt_ids)
        logprobs = self.sequence_logprobs(list(prompt_ids) + [dummy_prompt] * padding,
                                          list(reference_ids) + [[self._eos_token_id()]] * padding)
        return logprobs[: len(prompt_ids)]

    def _tokenize_reference(self, reference: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Reference token ids (no special tokens) and their character offsets, cached per reference text."""
        if reference not in self._reference_tokens:
            encoded = self.tokenizer(
                reference, add_special_tokens=False, return_offsets_mapping=self.tokenizer.is_fast
            )
            offsets = encoded.get("offset_mapping") or []
            self._reference_tokens[reference] = (list(encoded["input_ids"]), [tuple(o) for o in offsets])
        return self._reference_tokens[reference]

    def _eos_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return eos if eos in self.eos_token_ids else self.eos_token_ids[0]

    def _replacement_generator(self) -> torch.Generator:
        """Per-rank generator for the uniform replacement positions, reproducible across resumes (no saved state)."""
        step, calls = self._replacement_calls
        calls = calls + 1 if step == self.state.global_step else 0
        self._replacement_calls = (self.state.global_step, calls)
        seed = ((self.args.arg_seed * 1_000_003 + self.state.global_step) * 1_009 + calls) * 131
        return torch.Generator().manual_seed(seed + self.accelerator.process_index)
