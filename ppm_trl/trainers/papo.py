"""PAPOTrainer: GRPO with decoupled outcome and correct-subset process advantages (PAPO paper §4, §6, A.3).

Two hooks of the base trainer (`base.py`, the seam with TRL):
1. `on_scores` (after TRL's outcome rewards) asks the process scorer (rubric judge or programmatic) about this
   process's CORRECT responses only — incorrect responses cost zero judge calls — and gathers the (B,) process
   scores (NaN = not judged or unscorable);
2. `compute_advantages` returns `papo_advantages` computed per group on the gathered batch (the base slices them to
   this process). The advantages stay 1-D, so every TRL `loss_type` and sequence-level importance sampling (GSPO)
   work unchanged.
The judge is not started early (`on_final_rollout`, as PPM does): which responses it grades depends on the outcome
rewards, and TRL computes those after its log-prob passes.
"""

from __future__ import annotations

import textwrap

import torch

from ..advantages import papo_advantages, papo_group_stats
from ..configs import PAPOConfig
from ..scorers import build_process_scorer
from .base import Advantages, MethodTrainer
from .common import (
    check_columns,
    check_reward_columns,
    completion_text,
    install_judge_stats,
    resolve_model_path,
    weighted_outcome,
)


class PAPOTrainer(MethodTrainer):
    """GRPO whose advantage is A_out + λ·A_proc, A_proc normalised over the correct responses only (PAPO §4.1).

    Args:
        process_scorer: a callable `(rows, texts) -> list[float | None]` scoring correct responses in [0, 1];
            default: built from `args.process_scorer` (`programmatic` point fraction, or the LiteLLM rubric `judge`).
        Everything else is `GRPOTrainer`'s. With the judge scorer the dataset needs a `reference` column.
    """

    _tag_names = ["trl", "grpo", "papo", "ppm-trl"]
    _name = "PAPO"
    _paper = {
        "title": "PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization",
        "id": "2603.26535",
        "citation": textwrap.dedent(
            """\
            @article{papo2026,
                title        = {{PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization}},
                year         = 2026,
                eprint       = {arXiv:2603.26535}
            }"""
        ),
    }

    def __init__(self, model, reward_funcs, args: PAPOConfig | None = None, train_dataset=None,
                 process_scorer=None, **kwargs):
        if not isinstance(args, PAPOConfig):
            raise TypeError(f"PAPOTrainer needs a PAPOConfig, got {type(args).__name__}")
        if process_scorer is None and args.process_scorer == "judge":
            check_columns(train_dataset, {"reference": "str"}, "PAPO (judge scorer)")
        elif process_scorer is None:
            check_columns(train_dataset, {"reasoning_points": "list", "env": "any"}, "PAPO (programmatic scorer)")
        self.process_scorer = process_scorer if process_scorer is not None else build_process_scorer(args)
        self._papo_process = None
        self._papo_stats_seen = {}
        check_reward_columns(train_dataset, reward_funcs, "PAPO")
        model = resolve_model_path(model, args)  # "tiny", or a local directory made absolute
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        install_judge_stats(self, self.process_scorer)

    def on_scores(self, rows, completions, completion_ids, rewards_per_func):
        super().on_scores(rows, completions, completion_ids, rewards_per_func)
        self._score_correct_responses(rows, completions, rewards_per_func)

    def compute_advantages(self, completion_mask, tool_mask):
        """A = A_out + λ·A_proc per group on the gathered batch; PAPO metrics."""
        args = self.args
        kwargs = dict(lam=args.process_weight, process_norm=args.process_norm, combine=args.combine,
                      eps=args.papo_epsilon)
        advantages = papo_advantages(self._papo_outcome, self._papo_process, self.num_generations, **kwargs)
        stats = papo_group_stats(self._papo_outcome, self._papo_process, self.num_generations, **kwargs)
        for name, value in stats.to_dict().items():
            self.log_metric(name, value)
        counters = dict(getattr(self.process_scorer, "stats", {}))
        for key in ("requests", "failures"):
            total = self.accelerator.gather(torch.tensor(
                float(counters.get(key, 0) - self._papo_stats_seen.get(key, 0)), device=self.accelerator.device))
            self.log_metric(f"papo/judge_{key}", total.sum().item())
        self._papo_stats_seen = counters
        return Advantages(advantages)

    def _score_correct_responses(self, inputs, completions, rewards_per_func) -> None:
        """Binary outcome of the gathered batch; process scores of this process's correct responses only."""
        outcome = weighted_outcome(rewards_per_func, self.reward_weights)
        correct = (outcome >= self.args.correct_threshold).to(outcome.dtype)
        self._papo_outcome = torch.where(torch.isnan(outcome), outcome, correct)
        start = self.accelerator.process_index * len(inputs)
        local_correct = (self._papo_outcome[start : start + len(inputs)] == 1).tolist()
        judged = [i for i, ok in enumerate(local_correct) if ok]
        process = torch.full((len(inputs),), float("nan"), device=self.accelerator.device)
        if judged:
            scores = self.process_scorer([inputs[i] for i in judged], [completion_text(completions[i]) for i in judged])
            if len(scores) != len(judged):
                raise ValueError(f"process scorer returned {len(scores)} scores for {len(judged)} responses")
            for i, score in zip(judged, scores):
                if score is not None and not 0.0 <= float(score) <= 1.0:
                    raise ValueError(f"process scorer returned {score!r} for row {i}; scores must lie in [0, 1]")
                process[i] = float("nan") if score is None else float(score)
        self._papo_process = self.accelerator.gather(process)
