"""ppm_trl: Progressive Point Matching, PAPO and Adaptive Reference Guidance for TRL's GRPOTrainer.

Imports are lazy so that `import ppm_trl` (and the pure math modules) stay light: TRL, transformers and
LiteLLM are only imported when a trainer, config or judge is first touched. Each method is a folder
(`ppm_trl/ppm/`, `ppm_trl/papo/`, `ppm_trl/arg/`) that registers itself; `ppm_trl.methods` finds them.
"""

from __future__ import annotations

import importlib

from . import methods  # noqa: F401  (its import fills the registry: every method folder, composed methods, entry points)
from .registry import METHODS

__version__ = "0.1.0"

# Every registered method's trainer and config (ppm_trl.methods), then the other public names.
_LAZY = {
    **{path.split(":")[1]: path.split(":")[0] for method in METHODS.values() if not method.config.startswith("trl:")
       for path in (method.trainer, method.config)},
    "LiteLLMJudge": "ppm_trl.judge",
    "ReasoningGraph": "ppm_trl.points",
    "PrefixSelector": "ppm_trl.arg",
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

