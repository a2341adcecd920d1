"""The method registry: one entry per training method — its config class, its trainer class, its default rewards.

`ppm-trl train --method`, the example scripts, the demo and `ppm_trl`'s own exports read this table, so a new
method is one `register_method` call. Classes are named "module:attribute" and imported on first use: reading the
table (e.g. to list the methods in `--help`) does not import TRL.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """A training method: `ppm-trl train --method <name>` builds `trainer_class()(args=config_class()(...))`."""

    name: str
    config: str  # "module:ConfigClass"
    trainer: str  # "module:TrainerClass"
    extra_rewards: tuple[str, ...] = ()  # reward functions added after the verifier when the user names none
    summary: str = ""

    def config_class(self) -> type:
        return _load(self.config)

    def trainer_class(self) -> type:
        return _load(self.trainer)


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The registered method `name`; an unknown name is an error that lists the accepted ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; accepted: {', '.join(METHODS)}")
    return METHODS[name]


def _load(path: str) -> type:
    module, attribute = path.split(":")
    return getattr(importlib.import_module(module), attribute)


register_method(Method("grpo", "trl:GRPOConfig", "trl:GRPOTrainer", summary="TRL's GRPO (sparse outcome reward)"))
register_method(Method("ppm", "ppm_trl.configs:PPMConfig", "ppm_trl.trainers.ppm:PPMGRPOTrainer",
                       summary="Progressive Point Matching: segment rewards, per-token advantages"))
register_method(Method("papo", "ppm_trl.configs:PAPOConfig", "ppm_trl.trainers.papo:PAPOTrainer",
                       summary="PAPO: outcome advantage + process advantage over the correct responses"))
register_method(Method("arg", "ppm_trl.configs:ARGConfig", "ppm_trl.trainers.arg:ARGTrainer", extra_rewards=("format",),
                       summary="Adaptive Reference Guidance for all-failure groups (reward: accuracy + 0.2·format)"))
register_method(Method("ppm+arg", "ppm_trl.configs:PPMARGConfig", "ppm_trl.trainers.composed:PPMARGTrainer",
                       summary="ARG's guidance for all-failure groups, then PPM's segment credit on every row"))
register_method(Method("papo+arg", "ppm_trl.configs:PAPOARGConfig", "ppm_trl.trainers.composed:PAPOARGTrainer",
                       summary="ARG's guidance for all-failure groups, then PAPO's decoupled advantages"))
