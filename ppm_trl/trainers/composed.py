"""Composed trainers: ARG's reference guidance decides which rows a group holds, PPM or PAPO decides their credit.

Composition is Python's method resolution order over the single-method trainers, with no hook written twice:

    PPMARGTrainer → ARGTrainer → PPMGRPOTrainer → MethodTrainer (base.py) → GRPOTrainer

`on_rollout` is ARG's (all-failure groups get accepted continuations or the reference, verified by the reward
functions alone, `MethodTrainer.outcome_rewards`), then TRL scores the FINAL rows: `on_final_rollout` and
`compute_advantages` are PPM's (segment progress of every row, inserted ones judged like any rollout; (B, T)
advantages) or PAPO's (process scores of the correct rows; (B,) advantages). ARG's own advantage (accuracy +
0.2·format, std-normalised) is thereby replaced by the crediting method's; its selector feedback is unchanged.
The reward functions' columns are checked, and the model path resolved, once (in `MethodTrainer.__init__`).
The dataset needs both methods' columns (`reference`; `reasoning_points` for PPM), and the
model card cites both papers: the registry (`ppm_trl.methods`, `parts=("ppm", "arg")`) says so.
"""

from __future__ import annotations

from ..configs import PAPOARGConfig, PPMARGConfig
from .arg import ARGTrainer
from .papo import PAPOTrainer
from .ppm import PPMGRPOTrainer


class PPMARGTrainer(ARGTrainer, PPMGRPOTrainer):
    """ARG's guidance for all-failure groups (ARG §4, Alg. 1), then PPM's segment progress and per-token advantages
    over all rows of the final groups (PPM §4–5). Takes a [`PPMARGConfig`] and PPM's `progress_scorer` argument."""

    def __init__(self, model, reward_funcs=None, args: PPMARGConfig | None = None, train_dataset=None, **kwargs):
        if args is None:
            args = self.default_config(model)
        if not isinstance(args, PPMARGConfig):
            raise TypeError(f"PPMARGTrainer needs a PPMARGConfig, got {type(args).__name__}")
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)


class PAPOARGTrainer(ARGTrainer, PAPOTrainer):
    """ARG's guidance for all-failure groups (ARG §4, Alg. 1), then PAPO's A_out + λ·A_proc over the final groups
    (PAPO §4.1): inserted correct rows are rubric-scored like any correct response. Takes a [`PAPOARGConfig`]."""

    def __init__(self, model, reward_funcs=None, args: PAPOARGConfig | None = None, train_dataset=None, **kwargs):
        if args is None:
            args = self.default_config(model)
        if not isinstance(args, PAPOARGConfig):
            raise TypeError(f"PAPOARGTrainer needs a PAPOARGConfig, got {type(args).__name__}")
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
