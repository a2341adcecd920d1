"""ppm_trl: Progressive Point Matching, PAPO and Adaptive Reference Guidance for TRL's GRPOTrainer.

Imports are lazy so that `import ppm_trl` (and the pure math modules) stay light: TRL, transformers and
LiteLLM are only imported when a trainer, config or judge is first touched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from .methods import METHODS

__version__ = "0.1.0"

# Every registered method's trainer and config (ppm_trl.methods), then the other public names.
_LAZY = {
    **{path.split(":")[1]: path.split(":")[0] for method in METHODS.values() if not method.config.startswith("trl:")
       for path in (method.trainer, method.config)},
    "LiteLLMJudge": "ppm_trl.judge",
    "ReasoningGraph": "ppm_trl.points",
    "PrefixSelector": "ppm_trl.guidance",
    "build_tiny_model_and_tokenizer": "ppm_trl.tiny",
    "make_dataset": "ppm_trl.envs",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ppm_trl' has no attribute {name!r}")


# DESIGN.md's Public API names the pure guidance core `ppm_trl.arg`; its file is `guidance.py`, so that one file name
# means one module (`trainers/arg.py` is the trainer). A meta-path alias keeps `import ppm_trl.arg` and
# `from ppm_trl.arg import ...` working with the very same module object (one `PrefixSelector` class), and only
# imports it on first use, so `import ppm_trl` stays free of torch. An eager `sys.modules` entry would import torch
# here; a second file would be a second module.
_MODULE_ALIASES = {f"{__name__}.arg": f"{__name__}.guidance"}


class _ModuleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an alias in `_MODULE_ALIASES` as the module it names (the same object, under both names)."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in _MODULE_ALIASES else None

    def create_module(self, spec):
        module = importlib.import_module(_MODULE_ALIASES[spec.name])
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the alias's; restored below
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


# First, ahead of finders that would load a stale `arg.py` file; once, also when this package is reloaded.
sys.meta_path[:] = [_ModuleAlias()] + [f for f in sys.meta_path if type(f).__qualname__ != _ModuleAlias.__qualname__]
