"""PAPOTrainer: GRPO with decoupled outcome and correct-subset process advantages (PAPO paper §4, §6, A.3).

Two hooks of the base trainer (`ppm_trl.trainers.base`, the seam with TRL), keeping nothing on `self` between them:
1. `on_final_rollout` (the rows are final; TRL's log-prob passes come next) computes the outcome rewards right
   away (`compute_rewards_early`: TRL's reward pass then reuses them, so the reward functions still run once) and
   starts the process scorer (rubric judge or programmatic) on this process's CORRECT responses only — incorrect
   responses cost zero judge calls — on the base's background worker (`overlap_scoring`, on by default), so that
   the judge's latency runs under those passes; it returns a `PendingProcessScores` (outcome, judged rows, Future);
2. `compute_advantages(batch)` (after TRL's rewards and advantages) takes the binary outcome of the gathered batch,
   collects the process scores from `batch.pending` — or, with `overlap_scoring` off (or a `rollout_func`'s extra
   fields, which join the rows only at TRL's reward pass), scores the correct responses right there — checks them
   (NaN = not judged or unscorable), gathers them to (B,), and returns `papo_advantages` computed per group on the
   gathered batch (the base slices them to this process). The advantages stay 1-D, so every TRL `loss_type` and
   sequence-level importance sampling (GSPO) work unchanged.
Either way the same responses go to the same scorer once, and its errors (and the score checks) are raised in 2.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import torch

from ..advantages import batch_normalize, normalize_then_sum
from ..text import completion_text
from ..trainers.base import Advantages, ScoredMethodTrainer
from ..trainers.common import weighted_outcome
from .papo_config import PAPOConfig
from .papo_estimators import papo_advantages, papo_group_stats
from .process_scorers import build_process_scorer


@dataclass(frozen=True)
class PendingProcessScores:
    """The early outcome and the process scoring `on_final_rollout` started for one generation batch, collected by
    `compute_advantages`."""

    outcome: torch.Tensor  # (B_global,) binary outcome of the early rewards: TRL's must be the same (checked)
    judged_rows: list[int]  # this process's correct rows, the ones the scorer scores
    scores: Future | list  # → one score per judged row (a Future while the scorer runs; [] when none is judged)


class PAPOTrainer(ScoredMethodTrainer):
    """GRPO whose advantage is A_out + λ·A_proc, A_proc normalised over the correct responses only (PAPO §4.1).

    Args:
        process_scorer: a callable `(rows, texts) -> list[float | None]` scoring correct responses in [0, 1];
            default: built from `args.process_scorer` (`programmatic` point fraction, or the LiteLLM rubric `judge`).
            With `args.overlap_scoring` (default) it is called on the base's worker thread, while TRL computes
            log-probs; a scorer that must run on the training thread (e.g. one that uses the policy's GPU) needs it off.
        Everything else is `GRPOTrainer`'s; without `args`, `PAPOConfig("<model name>-PAPO")`. With the judge
        scorer the dataset needs a `reference` column.
    """

    method_name, config_class, scorer_attribute = "papo", PAPOConfig, "process_scorer"
    scorer_counts = ("papo/judge_", ("requests", "failures"))

    def __init__(self, model, reward_funcs=None, args: PAPOConfig | None = None, train_dataset=None,
                 process_scorer=None, **kwargs):
        super().__init__(model, reward_funcs, args, train_dataset, scorer=process_scorer, **kwargs)

    def build_scorer(self, args):
        return build_process_scorer(args)

    def on_final_rollout(self, rollout):
        super().on_final_rollout(rollout)
        if not self.args.overlap_scoring or rollout.extra_fields:
            return None
        early = self.compute_rewards_early(rollout)
        outcome = self._binary_outcome(weighted_outcome(early, self.outcome_reward_weights))
        judged = self._local_correct(outcome, self.local_rows(len(rollout.rows)))
        scores = self.run_in_background(self._score, rollout.rows, rollout.completions, judged) if judged else []
        return PendingProcessScores(outcome, judged, scores)  # collected in compute_advantages

    def compute_advantages(self, batch):
        """A = A_out + λ·A_proc per group on the gathered batch; PAPO metrics."""
        outcome = self._binary_outcome(batch.outcome)
        pending = batch.pending
        if pending is not None:
            if not torch.equal(pending.outcome.nan_to_num(-1.0), outcome.nan_to_num(-1.0)):
                raise RuntimeError("PAPO: the outcome rewarded early differs from TRL's (a bug)")
            judged, scores = pending.judged_rows, pending.scores
        else:
            judged = self._local_correct(outcome, batch.local)
            scores = self._score(batch.rows, batch.completions, judged) if judged else []
        process = self._collect_process_scores(judged, scores, len(batch.rows))
        args = self.args
        kwargs = dict(lam=args.process_weight, process_norm=args.process_norm, combine=args.combine,
                      eps=args.papo_epsilon)
        if args.multi_objective_aggregation == "normalize_then_sum":
            # TRL's advantage of that aggregation is A_out; the binary outcome (the verifier) still picks C.
            kwargs["outcome_advantage"] = batch_normalize(normalize_then_sum(
                batch.rewards_per_func, self.outcome_reward_weights, self.num_generations))
        advantages = papo_advantages(outcome, process, self.num_generations, **kwargs)
        stats = papo_group_stats(outcome, process, self.num_generations, **kwargs)
        for name, value in stats.to_dict().items():
            self.log_metric(name, value)
        self.log_scorer_counts()
        return Advantages(advantages)

    # ---------------------------------------------------------------------------------------------- pieces
    def _binary_outcome(self, outcome) -> torch.Tensor:
        """(B_global,) r_out ∈ {0, 1} of the gathered weighted outcome; NaN where every reward function returned
        None."""
        correct = (outcome >= self.args.correct_threshold).to(outcome.dtype)
        return torch.where(torch.isnan(outcome), outcome, correct)

    @staticmethod
    def _local_correct(outcome, local: slice) -> list[int]:
        """Indices of this process's correct rows (each process judges its own slice of the gathered batch)."""
        return [i for i, ok in enumerate((outcome[local] == 1).tolist()) if ok]

    def _score(self, rows, completions, judged) -> list:
        """The process scorer on the judged rows; runs on the background worker with `overlap_scoring`."""
        return self.process_scorer([rows[i] for i in judged], [completion_text(completions[i]) for i in judged])

    def _collect_process_scores(self, judged: list[int], scores, num_local_rows: int) -> torch.Tensor:
        """(B_global,) process scores: this process's (waiting for the worker if they were started early),
        checked, NaN for rows not judged or unscorable, gathered."""
        if isinstance(scores, Future):
            scores = scores.result()  # the scorer's own exception, if it raised
        if len(scores) != len(judged):
            raise ValueError(f"process scorer returned {len(scores)} scores for {len(judged)} responses")
        process = torch.full((num_local_rows,), float("nan"), device=self.accelerator.device)
        for i, score in zip(judged, scores):
            if score is not None and not 0.0 <= float(score) <= 1.0:
                raise ValueError(f"process scorer returned {score!r} for row {i}; scores must lie in [0, 1]")
            process[i] = float("nan") if score is None else float(score)
        return self.accelerator.gather(process)
