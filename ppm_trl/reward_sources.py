"""Where a `--reward_funcs` name comes from, as TRL's own `trl grpo` script reads it: this package's registered
rewards (`REWARDS`), TRL's named rewards, or a dotted import path to the user's own function
(`my_lib.rewards.custom_reward`, imported with the working directory on `sys.path`, as TRL does). `--reward_model_name_or_path`
adds a reward model in front, which GRPOTrainer loads itself.

Every name is resolved before any model is loaded: an import that fails or an object that is not callable is one
error naming the path.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .flags import UsageError
from .registry import REWARDS, Reward


@dataclass(frozen=True)
class TRLReward:
    """One of the names `trl grpo --reward_funcs` accepts: TRL's reward function ("module:attribute", imported on
    first use, as the registry names TRL's trainer), called with `kwargs` when it is a factory, and the dataset
    columns it reads."""

    function: str
    columns: tuple[str, ...] = ()
    kwargs: tuple[tuple[str, int], ...] | None = None  # a factory's arguments, as TRL's script passes them

    def load(self) -> Callable:
        function = Reward(self.function, self.function).load()
        return function(**dict(self.kwargs)) if self.kwargs is not None else function


TRL_REWARDS = {
    "accuracy_reward": TRLReward("trl.rewards:accuracy_reward", ("solution",)),
    "reasoning_accuracy_reward": TRLReward("trl.rewards:reasoning_accuracy_reward", ("solution",)),
    "think_format_reward": TRLReward("trl.rewards:think_format_reward"),
    "get_soft_overlong_punishment": TRLReward("trl.rewards:get_soft_overlong_punishment", (),
                                              (("max_completion_len", 1280), ("soft_punish_cache", 256))),
}


def is_import_path(name: str) -> bool:
    return "." in name and name not in REWARDS and name not in TRL_REWARDS


def reward_columns(name: str) -> tuple[str, ...]:
    """The dataset columns reward `name` reads (a user's own function: none known; it gets every column)."""
    if name in REWARDS:
        return REWARDS[name].columns
    if name in TRL_REWARDS:
        return TRL_REWARDS[name].columns
    return ()


def load_reward(name: str) -> Callable:
    """The reward function `name` names (see the module doc); a UsageError naming what is wrong otherwise."""
    if name in REWARDS:
        return REWARDS[name].load()
    if name in TRL_REWARDS:
        return TRL_REWARDS[name].load()
    if not is_import_path(name):
        raise UsageError(f"unknown reward function {name!r}: give one of {', '.join(REWARDS)}, TRL's "
                         f"{', '.join(TRL_REWARDS)}, or a dotted import path to your own (my_lib.rewards.my_reward)")
    module_path, _, attribute = name.rpartition(".")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `my_rewards.py` next to the config works, as with `trl grpo`
    try:
        module = importlib.import_module(module_path)
    except Exception as error:  # noqa: BLE001 - the user's module: any import failure is theirs to see, named
        raise UsageError(f"reward function {name!r}: importing {module_path!r} failed ({type(error).__name__}: "
                         f"{error})") from error
    function = getattr(module, attribute, None)
    if function is None:
        raise UsageError(f"reward function {name!r}: module {module_path!r} ({getattr(module, '__file__', '?')}) has "
                         f"no attribute {attribute!r}")
    if not callable(function):
        raise UsageError(f"reward function {name!r} is a {type(function).__name__}, not a callable "
                         "`(completions, **columns) -> list[float]`")
    return function
