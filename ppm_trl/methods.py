"""The registries: one record per training method and one per reward function; everything else reads them.

A `Method` names its config and trainer classes, the dataset columns it reads (derived from its config: scorer,
mode), its paper, model-card name and tags, and the reward functions it adds by default. A `Reward` names a reward
function and the columns it reads. `ppm-trl train --method/--reward_funcs`, the column checks (`columns.py` before
any model is loaded, the trainers' own), the demo, the model cards and `ppm_trl`'s exports all read these tables,
so a new method is one `register_method` call plus its trainer file (docs/design.md, "Adding a method").

Classes and functions are named "module:attribute" and imported on first use: reading the tables (e.g. to list the
methods in `--help`) does not import TRL. Nothing here imports a trainer.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
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


# ------------------------------------------------------------------------------------------------ reward functions
register_reward(Reward("env_outcome", "ppm_trl.rewards:env_outcome_reward", ("env",)))
register_reward(Reward("accuracy", "ppm_trl.rewards:accuracy_reward", ("answer",)))
register_reward(Reward("format", "ppm_trl.rewards:format_reward"))
register_reward(Reward("env_point_fraction", "ppm_trl.rewards:env_point_fraction", ("env", "reasoning_points")))


# --------------------------------------------------------------------------------------------------------- methods
def _ppm_columns(args, custom_scorer: bool = False) -> dict[str, Column]:
    needs = {"reasoning_points": Column("list", "PPM")}
    if not custom_scorer and getattr(args, "progress_scorer", None) == "programmatic":
        needs["env"] = Column("any", "PPM's programmatic progress scorer (`progress_scorer: programmatic`)")
    return needs


def _papo_columns(args, custom_scorer: bool = False) -> dict[str, Column]:
    if custom_scorer:
        return {}
    if getattr(args, "process_scorer", None) == "judge":
        return {"reference": Column("str", "PAPO's judge process scorer (`process_scorer: judge`)")}
    reader = "PAPO's programmatic process scorer (`process_scorer: programmatic`)"
    return {"reasoning_points": Column("list", reader), "env": Column("any", reader)}


def _arg_columns(args, custom_scorer: bool = False) -> dict[str, Column]:
    # The ARG trainer checks each reference's final-answer marker itself (`arg_skip_invalid_references`).
    return {"reference": Column("any", "ARG (reference-guided continuations)")}


PPM_PAPER = Paper(
    "Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching", "2609.07303",
    textwrap.dedent("""\
        @article{ppm2026,
            title        = {{Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching}},
            author       = {Kevin Frans and Oleh Rybkin and Sergey Levine and Aviral Kumar and others},
            year         = 2026,
            eprint       = {arXiv:2609.07303}
        }"""))
PAPO_PAPER = Paper(
    "PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization", "2603.26535",
    textwrap.dedent("""\
        @article{papo2026,
            title        = {{PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization}},
            year         = 2026,
            eprint       = {arXiv:2603.26535}
        }"""))
ARG_PAPER = Paper(
    "Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning RL", "2610.11128",
    textwrap.dedent("""\
        @article{wang2026balancing,
            title        = {{Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning RL}},
            author       = {Hanyu Wang and Nakul Agarwal and Hossein Nourkhiz Mahjoub and Ehsan Moradi Pari and Makoto Fukushima and Jinghui Chen and Vaishnav Tadiparthi},
            year         = 2026,
            eprint       = {arXiv:2610.11128}
        }"""))

register_method(Method("grpo", "trl:GRPOConfig", "trl:GRPOTrainer", summary="TRL's GRPO (sparse outcome reward)"))
register_method(Method("ppm", "ppm_trl.configs:PPMConfig", "ppm_trl.trainers.ppm:PPMGRPOTrainer",
                       summary="Progressive Point Matching: segment rewards, per-token advantages",
                       columns=_ppm_columns, paper=PPM_PAPER, card_name="PPM-GRPO"))
register_method(Method("papo", "ppm_trl.configs:PAPOConfig", "ppm_trl.trainers.papo:PAPOTrainer",
                       summary="PAPO: outcome advantage + process advantage over the correct responses",
                       columns=_papo_columns, paper=PAPO_PAPER, card_name="PAPO"))
register_method(Method("arg", "ppm_trl.configs:ARGConfig", "ppm_trl.trainers.arg:ARGTrainer", extra_rewards=("format",),
                       summary="Adaptive Reference Guidance for all-failure groups (reward: accuracy + "
                               "format_reward_weight·format)",
                       columns=_arg_columns, paper=ARG_PAPER, card_name="ARG"))
register_method(Method("ppm+arg", "ppm_trl.configs:PPMARGConfig", "ppm_trl.trainers.composed:PPMARGTrainer",
                       summary="ARG's guidance for all-failure groups, then PPM's segment credit on every row",
                       parts=("ppm", "arg")))
register_method(Method("papo+arg", "ppm_trl.configs:PAPOARGConfig", "ppm_trl.trainers.composed:PAPOARGTrainer",
                       summary="ARG's guidance for all-failure groups, then PAPO's decoupled advantages",
                       parts=("papo", "arg")))
