"""PPMGRPOTrainer: GRPO with Progressive Point Matching segment rewards and per-token advantages.

Two hooks of the base trainer (`ppm_trl.trainers.base`, the seam with TRL), keeping nothing on `self` between them:
1. `on_final_rollout` (the rows are final; TRL's log-prob passes come next) starts the progress scoring of the
   batch — decoding each completion's K prefixes and asking the scorer (the judge) for m_1..m_K — on the base's
   background worker (`overlap_scoring`, on by default), so that the judge's latency runs under those passes, and
   returns a `PendingProgress` (scored ids, prefix lengths, the scorer's Future);
2. `compute_advantages(batch)` (after TRL's rewards and advantages) collects that (B_local, K) progress from
   `batch.pending` — or, with `overlap_scoring` off, scores it right there — gathers the (B, K) progress of the
   whole generation batch, and returns `ppm_segment_advantages` per group on it with each token's segment: the base
   slices them to this process and expands them to (B, T) per-token advantages. Either way the same texts go to the
   same scorer once, and its errors are raised here.
Everything group-based happens before TRL shuffles and splits the batch; TRL's loss consumes (B, T) as is.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import torch

from ..advantages import normalize_then_sum, zero_advantage_groups
from ..scorers import reasoning_graph_of
from ..trainers.base import Advantages, ScoredMethodTrainer
from .ppm_config import PPMConfig
from .ppm_estimators import ppm_estimator
from .progress_scorers import ProgressScorer, build_progress_scorer
from .segmentation import SEGMENTATIONS, SegmentationSettings, nonempty_segments


@dataclass(frozen=True)
class PendingProgress:
    """The progress scoring `on_final_rollout` started for one generation batch, collected by `compute_advantages`."""

    completion_ids: list[list[int]]  # a copy of the ids scored: TRL's must be the same (checked when collected)
    prefix_lengths: torch.Tensor  # (B_local, K) tokens of c_1..c_k the scorer judges
    progress: Future  # → (B_local, K) progress from the scorer, or its exception


class PPMGRPOTrainer(ScoredMethodTrainer):
    """GRPO whose advantages are Progressive Point Matching segment advantages (PPM paper §4–5, Alg. 1, App. B).

    Args:
        progress_scorer: a callable `(rows, texts) -> (N, K) progress` (see `progress_scorers.ProgressScorer`);
            default: built from `args.progress_scorer` (`programmatic` env matchers or the LiteLLM `judge`). With
            `args.overlap_scoring` (default) it is called on the base's worker thread, while TRL computes log-probs;
            a scorer that must run on the training thread (e.g. one that uses the policy's GPU) needs it off.
        Everything else is `GRPOTrainer`'s; without `args`, `PPMConfig("<model name>-PPM")`. With the built-in
        scorers the train dataset needs `reasoning_points` (and `reasoning_graph`); with your own, no column.
    """

    method_name, config_class, scorer_attribute = "ppm", PPMConfig, "progress_scorer"
    scorer_counts = ("ppm/scorer_", ("requests", "skipped_empty", "skipped_unchanged", "deduplicated", "failures"))

    def __init__(self, model, reward_funcs=None, args: PPMConfig | None = None, train_dataset=None,
                 progress_scorer: ProgressScorer | None = None, **kwargs):
        super().__init__(model, reward_funcs, args, train_dataset, scorer=progress_scorer, **kwargs)

    def build_scorer(self, args) -> ProgressScorer:
        return build_progress_scorer(args)

    def check_dataset(self, train_dataset) -> None:
        """Every row's `reasoning_graph` must parse against its points (the error names the row and the rule)."""
        if train_dataset is None or not hasattr(train_dataset, "__len__") or \
                "reasoning_graph" not in (train_dataset.column_names or []):
            return
        for index, (points, graph) in enumerate(zip(train_dataset["reasoning_points"],
                                                    train_dataset["reasoning_graph"])):
            try:
                reasoning_graph_of({"reasoning_points": points, "reasoning_graph": graph})
            except ValueError as error:
                raise ValueError(f"PPM: column `reasoning_graph`, row {index}: {error}") from None

    # ------------------------------------------------------------------------------------------ base hooks
    def on_final_rollout(self, rollout):
        super().on_final_rollout(rollout)
        # A rollout_func's extra fields join the rows only just before TRL's rewards: score those rows then.
        if not self.args.overlap_scoring or rollout.extra_fields:
            return None
        # A copy taken now: the worker scores exactly these ids, and `compute_advantages` compares TRL's ids with
        # them (the rollout's own lists stay live and would always equal whatever TRL is given).
        submitted = [list(ids) for ids in rollout.completion_ids]
        prefix_lengths = self._prefix_lengths(submitted, rollout.tool_mask)
        future = self.run_in_background(self._score_progress, rollout.rows, submitted, prefix_lengths)
        return PendingProgress(submitted, prefix_lengths, future)

    def compute_advantages(self, batch):
        args = self.args
        progress, prefix_lengths = self._collect_progress(batch)  # this process's (B_local, K)
        valid = nonempty_segments(prefix_lengths)
        device = self.accelerator.device
        progress = self.accelerator.gather(progress.to(device))
        valid = self.accelerator.gather(valid.to(device))
        outcome = batch.outcome  # Σ_f w_f·r_f; normalize_then_sum: Σ_f w_f·(r_f normalised within its group)
        if args.multi_objective_aggregation == "normalize_then_sum":
            outcome = normalize_then_sum(batch.rewards_per_func, self.outcome_reward_weights, self.num_generations)
        advantages = self._segment_advantages(progress, outcome, valid)  # (B_global, K)
        dropped = None
        if args.filter_zero_advantage_groups:
            dropped = zero_advantage_groups(advantages, self.num_generations).repeat_interleave(self.num_generations)
        self._log_ppm(advantages, dropped if dropped is not None else torch.zeros(
            advantages.shape[0], dtype=torch.bool, device=advantages.device), progress, valid, outcome)
        # One scalar per row for the completions table (TRL formats advantages as floats).
        row_mean = (advantages * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1)
        segment_ids = self._segment_ids(batch.completion_mask, batch.tool_mask, prefix_lengths)
        return Advantages(advantages, segment_ids=segment_ids, logged=row_mean, dropped=dropped)

    # ---------------------------------------------------------------------------------------------- pieces
    def _collect_progress(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's (B_local, K) progress and prefix lengths: the early scoring's (waiting for the worker), or
        scored now (overlap off, or a rollout_func's extra fields)."""
        pending = batch.pending
        if pending is not None:
            if pending.completion_ids != [list(ids) for ids in batch.completion_ids]:
                raise RuntimeError("PPM: the completions scored early are not the ones TRL rewards (a bug)")
            return pending.progress.result(), pending.prefix_lengths  # the scorer's own exception, if it raised
        rollout = self.current_rollout  # turn segmentation needs the tool mask
        prefix_lengths = self._prefix_lengths(batch.completion_ids, rollout.tool_mask if rollout is not None else None)
        return self._score_progress(batch.rows, batch.completion_ids, prefix_lengths), prefix_lengths

    def _prefix_lengths(self, completion_ids_list, rollout_tool_mask) -> torch.Tensor:
        """(B_local, K) number of tokens of each prefix c_1..c_k, cut by the config's segmentation."""
        return SEGMENTATIONS[self.args.segmentation].prefix_lengths(
            completion_ids_list, rollout_tool_mask, self._decode_for_segments, SegmentationSettings.of(self.args))

    def _decode_for_segments(self, ids) -> str:
        return self.processing_class.decode(ids, skip_special_tokens=True)  # the text the scorer's prefixes show

    def _score_progress(self, inputs, completion_ids_list, prefix_lengths) -> torch.Tensor:
        """(B_local, K) progress from the scorer; a scorer failure marks the row unscorable (NaN), never 0. Runs on
        the background worker when `overlap_scoring` (it reads only its arguments and the tokenizer)."""
        process_reward = self.args.progress_mode == "process_reward"
        texts = []
        for ids, ends in zip(completion_ids_list, prefix_lengths.tolist()):
            starts = [0] + ends[:-1] if process_reward else [0] * len(ends)
            texts.append(self.processing_class.batch_decode(
                [ids[s:e] for s, e in zip(starts, ends)], skip_special_tokens=True))
        progress = torch.as_tensor(self.progress_scorer(inputs, texts), dtype=torch.float32)
        if progress.shape != prefix_lengths.shape:
            raise ValueError(f"progress scorer returned shape {tuple(progress.shape)}, expected "
                             f"{tuple(prefix_lengths.shape)} (rows, num_segments)")
        bad = ~torch.isnan(progress) & ((progress < 0) | (progress > 1))
        if bad.any():
            row = int(bad.any(dim=1).nonzero()[0])
            raise ValueError(f"progress scorer returned values outside [0, 1] for row {row}: {progress[row].tolist()}")
        return progress

    def _segment_advantages(self, progress, outcome, valid) -> torch.Tensor:
        """(B_global, K) from the gathered progress, weighted outcome and non-empty-segment mask."""
        args = self.args
        estimator = ppm_estimator(args.granularity, args.progress_mode)
        return estimator(
            progress, outcome, self.num_generations, add_outcome=args.add_outcome_reward,
            scale=args.scale_rewards, valid=valid, outcome_weight=args.outcome_weight,
        )

    def _segment_ids(self, completion_mask, tool_mask, prefix_lengths) -> torch.Tensor:
        """(B_local, T) segment id of each token, cut by the config's segmentation where the scorer's prefixes were."""
        return SEGMENTATIONS[self.args.segmentation].segment_ids(completion_mask, tool_mask, prefix_lengths,
                                                                 SegmentationSettings.of(self.args))

    def _log_ppm(self, advantages: torch.Tensor, dropped: torch.Tensor, progress: torch.Tensor, valid: torch.Tensor,
                 outcome: torch.Tensor) -> None:
        measured = ~torch.isnan(progress).any(dim=1)
        # A NaN outcome (every reward function returned None) makes the row's advantage 0 as well when the outcome
        # enters the reward: such rows are unscorable too, and counted on their own.
        outcome_unscorable = torch.isnan(outcome.to(progress.device)) & self.args.add_outcome_reward
        monotone = torch.cummax(torch.nan_to_num(progress) * valid, dim=1).values
        for k in range(progress.shape[1]):
            self.log_metric(f"ppm/progress_segment_{k + 1}", monotone[measured, k].mean().nan_to_num().item())
        self.log_metric("ppm/final_progress", monotone[measured, -1].mean().nan_to_num().item())
        self.log_metric("ppm/unscorable_frac", (~measured | outcome_unscorable).float().mean().item())
        self.log_metric("ppm/outcome_unscorable_frac", outcome_unscorable.float().mean().item())
        groups = advantages.view(-1, self.num_generations, advantages.shape[1])
        self.log_metric("ppm/frac_groups_nonzero_advantage", (groups.abs().amax(dim=(1, 2)) > 1e-8).float().mean())
        self.log_metric("ppm/frac_rows_filtered", dropped.float().mean().item())
        self.log_scorer_counts()

