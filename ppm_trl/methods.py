"""The registries everything else reads: one record per training method and one per reward function.

`ppm-trl train --method/--reward_funcs`, the column checks (`columns.py` before any model is loaded, the trainers'
own), the demo, the model cards and `ppm_trl`'s exports all read `METHODS` and `REWARDS` (the mechanism is
`ppm_trl.registry`). This module fills them:

* the reward functions, and TRL's own `grpo`;
* every method folder of ppm_trl — a subpackage `ppm_trl/<name>/` holding a `<name>_trainer.py`, as TRL's
  `trl/experimental/<name>/` — imported here, so that its `__init__` registers its method. A new method is one new
  folder (docs/design.md, "Adding a method"); nothing else changes;
* the composed methods (`ppm+arg`, `papo+arg`: `ppm_trl/composed.py`), which join registered methods;
* the methods other installed packages declare under the entry-point group `ppm_trl.methods`.

Classes and functions are named "module:attribute" and imported on first use: reading the tables (e.g. to list the
methods in `--help`) does not import TRL, and a method folder's `__init__` imports nothing heavy.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys

from .registry import (
    Method,
    Reward,
    register_method,
    register_reward,
)

# How `--help` and the errors list ppm_trl's own method folders; any other folder follows, alphabetically.
LISTED_FIRST = ("ppm", "papo", "arg")


def method_folders(package: str = __package__) -> list[str]:
    """The method folders of `package`: its subpackages `<name>` that hold a `<name>_trainer.py` module, in the
    order `LISTED_FIRST` says, then alphabetically. Reads the file listing only; imports none of them."""
    found = []
    for info in pkgutil.iter_modules(sys.modules[package].__path__):
        if not info.ispkg:
            continue
        spec = importlib.util.find_spec(f"{package}.{info.name}")
        modules = pkgutil.iter_modules(spec.submodule_search_locations or [])
        if any(module.name == f"{info.name}_trainer" for module in modules):
            found.append(info.name)
    return sorted(found, key=lambda name: (LISTED_FIRST.index(name) if name in LISTED_FIRST else len(LISTED_FIRST),
                                           name))


def load_method_folders(package: str = __package__) -> list[str]:
    """Import every method folder (its `__init__` registers its method); a folder already imported is not imported
    again. Returns the folders' names."""
    names = method_folders(package)
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names


# ------------------------------------------------------------------------------------------------ reward functions
register_reward(Reward("env_outcome", "ppm_trl.rewards:env_outcome_reward", ("env",)))
register_reward(Reward("accuracy", "ppm_trl.rewards:accuracy_reward", ("answer",)))
register_reward(Reward("format", "ppm_trl.rewards:format_reward"))
register_reward(Reward("env_point_fraction", "ppm_trl.rewards:env_point_fraction", ("env", "reasoning_points")))

# --------------------------------------------------------------------------------------------------------- methods
register_method(Method("grpo", "trl:GRPOConfig", "trl:GRPOTrainer", summary="TRL's GRPO (sparse outcome reward)"))
load_method_folders()
# Composed methods read what each part reads and cite every part's paper (`Method.parts`).
register_method(Method("ppm+arg", "ppm_trl.composed:PPMARGConfig", "ppm_trl.composed:PPMARGTrainer",
                       summary="ARG's guidance for all-failure groups, then PPM's segment credit on every row",
                       parts=("ppm", "arg")))
register_method(Method("papo+arg", "ppm_trl.composed:PAPOARGConfig", "ppm_trl.composed:PAPOARGTrainer",
                       summary="ARG's guidance for all-failure groups, then PAPO's decoupled advantages",
                       parts=("papo", "arg")))


# ------------------------------------------------------------------------------------ methods of other packages
ENTRY_POINT_GROUP = "ppm_trl.methods"


def load_entry_point_methods(group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Methods of other installed packages, as verl loads external estimators: each entry point of `group` names a
    module (imported: its import registers its method with `register_method`) or a callable (called, to register).
    One that fails to load is a warning naming it, never a broken `ppm-trl`. Returns the names that loaded."""
    import warnings
    from importlib.metadata import entry_points

    loaded = []
    for point in entry_points(group=group):
        try:
            target = point.load()
            if callable(target):
                target()
            loaded.append(point.name)
        except Exception as error:  # noqa: BLE001 - another package's code: say which, keep ppm-trl working
            warnings.warn(f"ppm_trl: the method entry point {point.name!r} ({point.value}) did not load: "
                          f"{type(error).__name__}: {error}", stacklevel=2)
    return loaded


load_entry_point_methods()
