"""Composed methods: ARG's reference guidance decides which rows a group holds, PPM or PAPO decides their credit.

Their configs and trainers, in one module (registered in `ppm_trl.methods` as `ppm+arg` and `papo+arg`). A composed
config is the union of its parts' fields; a composed trainer is Python's method resolution order over the
single-method trainers, with no hook written twice:

    PPMARGTrainer → ARGTrainer → PPMGRPOTrainer → MethodTrainer (ppm_trl.trainers.base) → GRPOTrainer

`on_rollout` is ARG's (all-failure groups get accepted continuations or the reference, verified by the reward
functions alone, `MethodTrainer.outcome_rewards`), then TRL scores the FINAL rows: `on_final_rollout` and
`compute_advantages` are PPM's (segment progress of every row, inserted ones judged like any rollout; (B, T)
advantages) or PAPO's (process scores of the correct rows; (B,) advantages). ARG's own advantage (accuracy +
0.2·format, std-normalised) is thereby replaced by the crediting method's; its selector feedback is unchanged.
The reward functions' columns are checked, and the model path resolved, once (in `MethodTrainer.__init__`).
The dataset needs both methods' columns (`reference`; `reasoning_points` for PPM), and the
model card cites both papers: the registry (`ppm_trl.methods`, `parts=("ppm", "arg")`) says so. Where both
papers set a TRL default, the config says whose wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arg.arg_config import ARGConfig, arg_trl_defaults
from .arg.arg_trainer import ARGTrainer
from .papo.papo_config import PAPOConfig
from .papo.papo_trainer import PAPOTrainer
from .ppm.ppm_config import PPMConfig
from .ppm.ppm_trainer import PPMGRPOTrainer


@dataclass
class PPMARGConfig(PPMConfig, ARGConfig):
    r"""Configuration of [`PPMARGTrainer`]: ARG's reference guidance for all-failure groups, then PPM's credit.

    Every field of [`PPMConfig`] and [`ARGConfig`]. Where both papers set a TRL default, PPM's wins (it decides the
    advantages): lr 3e-6, 16 generations, clip 0.20/0.28, no std division, masked truncations. The schedule (10
    warmup updates, then constant; weight decay 0.01) and the guidance knobs (levels, caps, selector) are ARG's.
    """

    warmup_steps: float = arg_trl_defaults()["warmup_steps"]
    weight_decay: float = arg_trl_defaults()["weight_decay"]
    lr_scheduler_type: str = arg_trl_defaults()["lr_scheduler_type"]


@dataclass
class PAPOARGConfig(PAPOConfig, ARGConfig):
    r"""Configuration of [`PAPOARGTrainer`]: ARG's reference guidance for all-failure groups, then PAPO's credit.

    Every field of [`PAPOConfig`] and [`ARGConfig`]. PAPO sets no TRL default of its own, so the optimisation
    defaults are ARG's: lr 1e-6 (TRL's), 8 generations, clip [0.8, 1.3] (eq. 29), 10 warmup updates then constant,
    weight decay 0.01.
    """

    epsilon: float = arg_trl_defaults()["epsilon"]
    epsilon_high: float | None = arg_trl_defaults()["epsilon_high"]
    warmup_steps: float = arg_trl_defaults()["warmup_steps"]
    weight_decay: float = arg_trl_defaults()["weight_decay"]
    lr_scheduler_type: str = arg_trl_defaults()["lr_scheduler_type"]


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
