"""`ScoredMethodTrainer`: the shape PPM and PAPO share — a method that scores rollouts for partial credit with one
scorer (the env's programmatic matcher, the LiteLLM judge, or the user's callable).

What it does once for both: the default config, the config's type, the columns the registered method reads (by the
method's name), the scorer from the argument or from the config, the refusal of environment-owned data for a
built-in scorer, the judge's statistics and budget callbacks, and the scorer's counters per step, gathered over the
processes and summed (the one rule for a count every process keeps). Each subclass keeps only its maths.
"""

from __future__ import annotations

from typing import Any

import torch

from ..common import check_method_columns, install_judge_stats, refuse_environment_owned_data
from .method_trainer import MethodTrainer


class ScoredMethodTrainer(MethodTrainer):
    """A `MethodTrainer` whose method asks one scorer for partial credit. A subclass sets the class attributes:

    - `method_name`: its registered name (`ppm_trl.registry`), whose columns the train dataset must hold;
    - `config_class`: the config it needs;
    - `scorer_attribute`: its scorer's keyword argument and attribute (`progress_scorer`, `process_scorer`);
    - `scorer_counts`: (metric prefix, the scorer's `stats` counters logged per step under it);

    and the method `build_scorer(args)`, the scorer its config names (no default: each method names its own);
    `check_dataset(train_dataset)` adds the method's own row checks.
    """

    method_name: str
    config_class: type
    scorer_attribute: str
    scorer_counts: tuple[str, tuple[str, ...]]

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, scorer=None, **kwargs):
        if args is None:  # the method's config defaults, as GRPOTrainer builds its own
            args = self.default_config(model)
        if not isinstance(args, self.config_class):
            raise TypeError(f"{self._method_trainer_name()} needs a {self.config_class.__name__}, got "
                            f"{type(args).__name__}")
        check_method_columns(train_dataset, self.method_name, args, custom_scorer=scorer is not None)
        self.check_dataset(train_dataset)
        setattr(self, self.scorer_attribute, scorer if scorer is not None else self.build_scorer(args))
        self._scorer_counts_seen: dict[str, Any] = {}  # the counters at the last log, for per-step deltas
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        if scorer is None:  # after TRL's checks: environment-owned data has no column for a built-in scorer
            refuse_environment_owned_data(train_dataset, self.method_name, args, self.scorer_attribute)
        install_judge_stats(self, self.scorer)

    @property
    def scorer(self):
        """The method's scorer (also under its own name, `scorer_attribute`)."""
        return getattr(self, self.scorer_attribute)

    def check_dataset(self, train_dataset) -> None:
        """Checks of the method's own beyond the registry's columns (an error names the column and the row)."""

    def method_scorers(self) -> list:
        return [*super().method_scorers(), self.scorer]

    def log_scorer_counts(self) -> None:
        """Log each counter of `scorer_counts` as its increase since the last log, summed over the processes."""
        prefix, keys = self.scorer_counts
        counters = dict(getattr(self.scorer, "stats", {}))
        device = self.accelerator.device
        for key in keys:
            increase = float(counters.get(key, 0) - self._scorer_counts_seen.get(key, 0))
            self.log_metric(f"{prefix}{key}", self.accelerator.gather(torch.tensor(increase, device=device)).sum().item())
        self._scorer_counts_seen = counters

    @classmethod
    def _method_trainer_name(cls) -> str:
        """The name of the class that set `config_class` (the method's own trainer, not a user's subclass)."""
        return next(k.__name__ for k in cls.__mro__ if "config_class" in vars(k))
