"""The method trainers' hooks and the data they exchange, hung on TRL's `_generate_and_score_completions`.

The order inside TRL 1.16's `GRPOTrainer._generate_and_score_completions`, which the hooks hang on:
1. `_generate(prompts)` (→ `on_rollout`, then `on_final_rollout`) and padding into tensors;
2. under no_grad, the old-policy log-probs (only when `gradient_accumulation_steps % (steps_per_generation ×
   num_iterations) != 0`, or vLLM importance sampling) and the reference model's (only when `beta != 0`);
3. `_calculate_rewards`, then TRL's advantages (→ `compute_advantages`).
Work started in step 1 therefore runs during step 2 and is collected in step 3. Each TRL hook is overridden once,
here; the method trainers override the public hooks of `MethodHooks` and keep nothing on `self` between them: what
one step knows reaches `compute_advantages` as one frozen `ScoredBatch`, dropped with the batch.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, fields
from typing import Any

import torch
from trl import GRPOTrainer

from ...advantages import expand_segment_values
from ..common import weighted_outcome
from .contract import COMPLETION_STATISTICS


@dataclass
class Rollout:
    """One generation batch of this process, by name (TRL's `_generate` returns these as an 8-tuple)."""

    rows: list[dict]  # the dataset rows (TRL's `inputs`)
    prompts: list  # the prompts as TRL passed them to generation (text or messages)
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    tool_mask: list[list[int]] | None  # 1 = model token, 0 = tool/env output; None without tools
    completions: list  # decoded (text or assistant messages)
    logprobs: list[list[float | None]] | None  # sampling log-probs per token (vLLM), None (HF generate)
    extra_fields: dict
    images: Any
    tool_images: Any


@dataclass(frozen=True)
class ScoredBatch:
    """One generation batch of this process after TRL's rewards: what `compute_advantages` receives (training only).
    Rows, completions, ids and masks are this process's (B_local); rewards and outcome are gathered (B_global)."""

    rows: list[dict]  # the dataset rows TRL rewarded (with a rollout_func's extra fields)
    completions: list  # decoded (text or assistant messages)
    completion_ids: list[list[int]]
    rewards_per_func: torch.Tensor  # (B_global, F), NaN where a reward function returned None
    outcome: torch.Tensor  # (B_global,) Σ_f w_f·r_f (`weighted_outcome`), NaN where every function returned None
    completion_mask: torch.Tensor  # (B_local, T)
    tool_mask: torch.Tensor | None  # (B_local, T) 1 = model token; None without tools
    local: slice  # this process's rows within the gathered batch (`MethodTrainer.local_rows`)
    pending: Any = None  # what `on_final_rollout` returned for this batch (None: nothing started early)


@dataclass
class Advantages:
    """A method's advantages on the gathered batch (B_global rows)."""

    values: torch.Tensor  # (B,) per row, or (B, K) per segment with `segment_ids`
    segment_ids: torch.Tensor | None = None  # (B_local, T) segment index of each local token (for (B, K) values)
    logged: torch.Tensor | None = None  # (B,) one scalar per row for the completions table (default: `values`)
    dropped: torch.Tensor | None = None  # (B,) rows removed from the loss; not None → `num_items_in_batch` recounted
    extra: dict[str, torch.Tensor] | None = None  # (B_local, ...) tensors added to TRL's batch (for `method_loss`)


def completion_statistics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """TRL's completion metrics (gathered lengths, truncated = not ended by EOS/pad), as TRL computes them."""
    lengths = lengths.float()
    terminated = lengths[~truncated]
    if len(terminated) == 0:  # TRL's convention: no terminated row → 0
        terminated = torch.zeros(1, device=lengths.device)
    values = (lengths.mean(), lengths.min(), lengths.max(), truncated.float().mean(),
              terminated.mean(), terminated.min(), terminated.max())
    return {name: value.item() for name, value in zip(COMPLETION_STATISTICS, values)}


@dataclass(frozen=True)
class EarlyRewards:
    """The final rows' rewards computed before TRL's log-prob passes (`compute_rewards_early`), for its reward pass."""

    completion_ids: list[list[int]]  # a copy of the ids rewarded: TRL's must be the same (checked)
    rewards_per_func: torch.Tensor  # (B_global, F)


@dataclass(frozen=True)
class RewardedRows:
    """What TRL's reward pass rewarded in training, kept for the step's `ScoredBatch`."""

    rows: list[dict]  # the dataset rows (with a rollout_func's extra fields)
    completions: list
    completion_ids: list[list[int]]
    rewards_per_func: torch.Tensor  # (B_global, F)


class MethodHooks:
    """The public hooks a method trainer overrides, the helpers they call, and TRL's hooks that call them (mixed into
    `MethodTrainer`)."""

    # ------------------------------------------------------------------------------------------ public hooks
    def on_rollout(self, rollout: Rollout) -> Rollout:
        """Called after every generation (training and eval); return the rollout, rows replaced or not."""
        return rollout

    def on_final_rollout(self, rollout: Rollout) -> Any:
        """Called in training after every `on_rollout`, before TRL's log-prob passes: the rows are final. Work that
        only needs the completions (the judge) can start here with `run_in_background`; return what collects it,
        which `compute_advantages` receives as `batch.pending`. Evaluation never calls it."""
        return None

    def compute_advantages(self, batch: ScoredBatch) -> Advantages | None:
        """Called in training after TRL computed its advantages; None keeps TRL's."""
        return None

    def method_loss(self, model, inputs: dict) -> torch.Tensor | None:
        """The mean loss of one micro-batch of TRL's batch dict (with `Advantages.extra`'s tensors), replacing TRL's
        policy loss; the base divides it for gradient accumulation as TRL divides its own. None (the default) keeps
        TRL's loss."""
        return None

    def extra_checkpoint_state(self) -> dict[str, Any]:
        """{file name: JSON-able state} written into every checkpoint folder."""
        return {}

    def load_extra_checkpoint_state(self, states: dict[str, Any]) -> None:
        """Restore from {file name: state} read from the resumed checkpoint (files it lacks are absent)."""

    # ------------------------------------------------------------------------------ helpers the hooks call
    def run_in_background(self, function, *args) -> Future:
        """`function(*args)` on the trainer's one scoring worker thread; `result()` returns its value or re-raises
        its exception. Jobs run one at a time, in order; a job of a generation batch that is not collected by the
        end of that batch (its step failed) is cancelled or waited for there, so none outlives its batch."""
        if self._background_executor is None:
            self._background_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppm-trl-scoring")
        future = self._background_executor.submit(function, *args)
        if self._background_futures is None:
            self._background_futures = []
        self._background_futures.append(future)
        return future

    def compute_rewards_early(self, rollout: Rollout) -> torch.Tensor:
        """(B_global, F) rewards of the final rows, computed now — before TRL's log-prob passes — instead of in TRL's
        reward pass, which then returns these very values (the reward functions run once per batch either way, and
        their logs are TRL's). Training only (from `on_final_rollout`), a collective; not with a `rollout_func`'s
        extra fields, which join the rows only just before TRL's rewards."""
        if rollout.extra_fields:
            raise ValueError("compute_rewards_early: this rollout has a rollout_func's extra fields "
                             f"({sorted(rollout.extra_fields)}), which the rows get only at TRL's reward pass")
        rewards = GRPOTrainer._calculate_rewards(self, rollout.rows, rollout.prompts, rollout.completions,
                                                 rollout.completion_ids)
        self._early_rewards = EarlyRewards([list(ids) for ids in rollout.completion_ids], rewards)  # a copy: checked
        return rewards

    def log_metric(self, name: str, value: float) -> None:
        """Append `value` to metric `name` of the current mode (averaged by TRL at the next log)."""
        mode = "train" if self.model.training else "eval"
        self._metrics[mode][name].append(float(value))

    def outcome_rewards(self, rows, prompts, completions, completion_ids) -> torch.Tensor:
        """(B_global, F) rewards of the reward functions alone (no method scores; a collective). TRL scores the
        final rows again and logs those, so this call's pending logs are dropped."""
        rewards = GRPOTrainer._calculate_rewards(self, rows, prompts, completions, completion_ids)
        self._pending_extra_logs.clear()
        self._pending_metrics.clear()
        return rewards

    # ------------------------------------------------------------------------- TRL hooks (each overridden once)
    _current_rollout = None
    _current_rows = None
    _background_executor = None
    _background_futures: list[Future] | None = None  # the jobs of the generation batch being scored
    _early_rewards: EarlyRewards | None = None  # from `compute_rewards_early`, for TRL's reward pass
    _rewarded: RewardedRows | None = None  # TRL's reward pass, for the ScoredBatch
    _pending = None  # what `on_final_rollout` returned for the batch being scored

    def _generate(self, prompts):
        self._tokens_seen_before = self.state.num_input_tokens_seen
        output = super()._generate(prompts)
        names = [f.name for f in fields(Rollout) if f.name not in ("rows", "prompts")]  # TRL's tuple, in order
        rollout = Rollout(rows=self._current_rows, prompts=prompts, **dict(zip(names, output, strict=True)))
        rollout.completion_ids, rollout.completions = list(rollout.completion_ids), list(rollout.completions)
        if rollout.logprobs is not None:
            rollout.logprobs = list(rollout.logprobs)
        rollout = self.on_rollout(rollout)
        if type(self).on_rollout is not MethodHooks.on_rollout:  # rows may have changed: TRL's stats describe them
            self._relog_completion_statistics(rollout)
        self._current_rollout = rollout
        if self.model.training:  # evaluation scores nothing: no early judge requests either
            self._pending = self.on_final_rollout(rollout)
        return tuple(getattr(rollout, name) for name in names)

    def _compute_loss(self, model, inputs):
        loss = self.method_loss(model, inputs)
        if loss is None:
            return super()._compute_loss(model, inputs)
        return loss / self.current_gradient_accumulation_steps if self.model.training else loss

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        early, self._early_rewards = self._early_rewards, None
        if early is not None:
            rewards_per_func = early.rewards_per_func
            if [list(ids) for ids in early.completion_ids] != [list(ids) for ids in completion_ids_list]:
                raise RuntimeError("the completions rewarded early are not the ones TRL rewards (a bug)")
        else:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            self._rewarded = RewardedRows(inputs, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._current_rows = inputs  # `_generate` only receives the prompts
        try:
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                batch = self._scored_batch(output)
                advantages = self.compute_advantages(batch)
                if advantages is not None:
                    self._apply_advantages(output, advantages, batch.local)
            return output
        finally:
            self._current_rows = self._current_rollout = self._early_rewards = self._rewarded = self._pending = None
            # A job the batch did not collect (its step raised): drop it, and let none run into the next batch.
            for future in self._background_futures or ():
                future.cancel()
            wait(self._background_futures or ())
            self._background_futures = None

    # ---------------------------------------------------------------------------------------------- the work
    def _scored_batch(self, output: dict) -> ScoredBatch:
        rewarded = self._rewarded
        return ScoredBatch(
            rows=rewarded.rows, completions=rewarded.completions, completion_ids=rewarded.completion_ids,
            rewards_per_func=rewarded.rewards_per_func,
            outcome=weighted_outcome(rewarded.rewards_per_func, self.outcome_reward_weights),
            completion_mask=output["completion_mask"], tool_mask=output.get("tool_mask"),
            local=self.local_rows(output["completion_ids"].shape[0]), pending=self._pending,
        )

    def _apply_advantages(self, output: dict, advantages: Advantages, local: slice) -> None:
        values = advantages.values[local]
        if advantages.segment_ids is not None:
            values = expand_segment_values(values.to(advantages.segment_ids.device), advantages.segment_ids)
        output["advantages"] = values.to(output["completion_ids"].device)
        for name, tensor in (advantages.extra or {}).items():
            output[name] = tensor.to(output["completion_ids"].device)
        if advantages.dropped is not None:
            dropped = advantages.dropped[local]
            if dropped.any():
                keep = (~dropped).to(output["completion_mask"].dtype).unsqueeze(1).to(output["completion_mask"].device)
                output["completion_mask"] = output["completion_mask"] * keep
            loss_mask = output["completion_mask"]
            if "tool_mask" in output:
                loss_mask = loss_mask * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        # TRL logged one float per gathered row: swap in ours (never a list).
        logged_values = (advantages.values if advantages.logged is None else advantages.logged).float().tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(logged_values), len(logged))):
            logged.pop()
        logged.extend(logged_values)

    def _relog_completion_statistics(self, rollout: Rollout) -> None:
        """Replace the token count and completion metrics TRL logged for the rows it generated by the final rows'."""
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        if rollout.tool_mask is not None:
            lengths = [sum(mask) for mask in rollout.tool_mask]
        else:
            lengths = [len(ids) for ids in rollout.completion_ids]
        lengths = self.accelerator.gather(torch.tensor(lengths, device=device))
        stops = {*self.eos_ids, self.tokenizer.pad_token_id}
        truncated = self.accelerator.gather(
            torch.tensor([not ids or ids[-1] not in stops for ids in rollout.completion_ids], device=device))
        metrics = self._metrics[mode]
        if mode == "train":
            prompt_tokens = self.accelerator.gather(torch.tensor([len(ids) for ids in rollout.prompt_ids],
                                                                 device=device)).sum().item()
            self.state.num_input_tokens_seen = self._tokens_seen_before + prompt_tokens + lengths.sum().item()
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        for name, value in completion_statistics(lengths, truncated).items():
            metrics[name][-1] = value
