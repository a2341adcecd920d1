"""PAPO ("PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization"): GRPO whose advantage
is A_out + λ·A_proc, the process advantage normalised over the correct responses only.

One folder, as TRL's `trl/experimental/<method>/`: `papo_config.py` (`PAPOConfig`), `papo_trainer.py`
(`PAPOTrainer`), and the pure pieces only PAPO uses — `papo_estimators.py` (its advantages and diagnostics) and
`process_scorers.py` (the rubric score of a correct response, programmatic or judged). This file registers the
method; the classes are imported on first use, so `import ppm_trl` stays free of TRL.
"""

from __future__ import annotations

import importlib
import textwrap

from ..registry import Column, Method, Paper, register_method

PAPER = Paper(
    "PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization", "2603.26535",
    textwrap.dedent("""\
        @article{papo2026,
            title        = {{PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization}},
            year         = 2026,
            eprint       = {arXiv:2603.26535}
        }"""))


def column_needs(args, custom_scorer: bool = False) -> dict[str, Column]:
    """The reference solution for the rubric judge; the rubric points and the env's name for the programmatic
    scorer; nothing when the trainer got its own scorer."""
    if custom_scorer:
        return {}
    if getattr(args, "process_scorer", None) == "judge":
        return {"reference": Column("str", "PAPO's judge process scorer (`process_scorer: judge`)")}
    reader = "PAPO's programmatic process scorer (`process_scorer: programmatic`)"
    return {"reasoning_points": Column("list", reader), "env": Column("any", reader)}


register_method(Method("papo", "ppm_trl.papo.papo_config:PAPOConfig", "ppm_trl.papo.papo_trainer:PAPOTrainer",
                       summary="PAPO: outcome advantage + process advantage over the correct responses",
                       columns=column_needs, paper=PAPER, card_name="PAPO"))

_EXPORTS = {"PAPOConfig": "papo_config", "PAPOTrainer": "papo_trainer"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
