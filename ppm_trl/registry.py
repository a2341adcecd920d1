"""The registry's mechanism: what a training method and a reward function are, and the two tables that hold them.

A `Method` names its config and trainer classes ("module:Class", imported on first use, so reading the tables does
not import TRL), the dataset columns it reads (derived from its config: scorer, mode), its paper, model-card name
and tags, and the reward functions it adds by default. A `Reward` names a reward function and the columns it reads.
Each method folder registers its own method in its `__init__` (`ppm_trl/ppm/__init__.py`, ...); `ppm_trl.methods`
finds the folders, registers TRL's `grpo` and the composed methods, and is what everything else reads.

Nothing here imports the rest of ppm_trl.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Paper:
    """A method's paper, as the model card cites it."""

    title: str
    arxiv_id: str | None
    bibtex: str


@dataclass(frozen=True)
class Column:
    """A dataset column a method reads: `kind` is what each cell must hold ("str": a non-empty string, "list": a
    non-empty list of non-empty strings, "any": anything); `reader` says who reads it, in errors."""

    kind: str
    reader: str


# (training config, whether the trainer was given its own scorer object) → {column: Column}
ColumnNeeds = Callable[[Any, bool], Mapping[str, Column]]


def _no_columns(args, custom_scorer: bool = False) -> dict[str, Column]:
    return {}


@dataclass(frozen=True)
class Method:
    """A training method: `ppm-trl train --method <name>` builds `trainer_class()(args=config_class()(...))`.

    A composed method (`parts=("ppm", "arg")`) reads what each of its parts reads and cites every part's paper;
    its own `columns` and `paper` are then left empty.
    """

    name: str
    config: str  # "module:ConfigClass"
    trainer: str  # "module:TrainerClass"
    extra_rewards: tuple[str, ...] = ()  # reward functions added after the verifier when the user names none
    summary: str = ""
    columns: ColumnNeeds = _no_columns  # the columns the dataset needs beyond `prompt` and the rewards' own
    paper: Paper | None = None
    card_name: str = ""  # "This model was trained with <card_name>" (default: the method's name)
    parts: tuple[str, ...] = ()  # the registered methods a composed method joins
    # What a finished run says of this method (`ppm_trl.report`): why nothing was learned, read from the logged
    # history and the config (None: no reason of this method's); the run's totals of this method's work
    stalled: Callable[[list[dict], Any], str | None] | None = None
    run_totals: Callable[[Any, list[dict]], dict] | None = None
    # The method's own config fields for a multi-turn rollout of n sub-problems (PPM: one segment per turn)
    multiturn_fields: Callable[[int], dict] | None = None

    def config_class(self) -> type:
        return _load(self.config)

    def trainer_class(self) -> type:
        return _load(self.trainer)

    def required_columns(self, args, custom_scorer: bool = False) -> dict[str, Column]:
        """Column → Column(kind, reader) for a training config; `custom_scorer`: the trainer got its own scorer
        object, so the columns the config's built-in scorer would read are not needed."""
        needs: dict[str, Column] = {}
        for method in [get_method(part) for part in self.parts] or [self]:
            for column, need in method.columns(args, custom_scorer).items():
                needs.setdefault(column, need)
        return needs

    def multiturn_settings(self, n: int) -> dict:
        """Config fields of this method (each of its parts') for a multi-turn rollout of n sub-problems."""
        settings: dict = {}
        for method in [get_method(part) for part in self.parts] or [self]:
            settings.update(method.multiturn_fields(n) if method.multiturn_fields else {})
        return settings

    def papers(self) -> list[Paper]:
        return [p for p in ([get_method(part).paper for part in self.parts] or [self.paper]) if p is not None]

    def model_card(self) -> dict:
        """TRL's model-card attributes of the trainer: `_name`, `_paper` ({title, id, citation}) and `_tag_names`."""
        names = [get_method(part).card_name or part for part in self.parts] or [self.card_name or self.name]
        papers = self.papers()
        paper = {"title": " + ".join(p.title for p in papers), "id": papers[0].arxiv_id,
                 "citation": "\n\n".join(p.bibtex for p in papers)} if papers else {}
        tags = ["trl", "grpo", *self.parts, self.name, "ppm-trl"]
        return {"_name": " + ".join(names), "_paper": paper, "_tag_names": list(dict.fromkeys(tags))}


@dataclass(frozen=True)
class Reward:
    """A reward function `ppm-trl train --reward_funcs <name>` can use, and the dataset columns it reads."""

    name: str
    function: str  # "module:function"
    columns: tuple[str, ...] = ()

    def load(self) -> Callable:
        return _load(self.function)


METHODS: dict[str, Method] = {}
REWARDS: dict[str, Reward] = {}


def register_method(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    unknown = [part for part in method.parts if part not in METHODS]
    if unknown:
        raise ValueError(f"method {method.name!r} joins unregistered method(s) {unknown}; register them first")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The registered method `name`; an unknown name is an error that lists the accepted ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; accepted: {', '.join(METHODS)}")
    return METHODS[name]


def method_of_trainer(cls: type) -> Method | None:
    """The registered method whose trainer is `cls` or its nearest registered base class (a user's subclass of
    `PPMGRPOTrainer` is a PPM trainer); None when there is none. Compares the "module:Class" names: imports nothing."""
    trainers = {method.trainer: method for method in METHODS.values()}
    for klass in cls.__mro__:
        method = trainers.get(f"{klass.__module__}:{klass.__qualname__}")
        if method is not None:
            return method
    return None


def register_reward(reward: Reward) -> Reward:
    if reward.name in REWARDS:
        raise ValueError(f"reward function {reward.name!r} is already registered")
    REWARDS[reward.name] = reward
    return reward


def get_reward(name: str) -> Reward:
    """The registered reward function `name`; an unknown name is an error that lists the accepted ones."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward function {name!r}; accepted: {', '.join(REWARDS)}")
    return REWARDS[name]


def reward_of_function(function: Callable) -> Reward | None:
    """The registered reward whose function `function` is (through `functools.wraps`); None for a user's own."""
    function = inspect.unwrap(function)
    for reward in REWARDS.values():
        module, attribute = reward.function.split(":")
        if getattr(function, "__module__", None) == module and getattr(function, "__qualname__", None) == attribute:
            return reward
    return None


def _load(path: str) -> Any:
    module, attribute = path.split(":")
    return getattr(importlib.import_module(module), attribute)
