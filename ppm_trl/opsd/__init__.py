"""OPSD, the PPM paper's baseline (App. B.1, eq. 111): on-policy self-distillation — the policy's own rollouts,
trained to match, token by token (generalized JSD), a fixed teacher: the starting policy given the reference solution
as privileged context.

One folder, as TRL's `trl/experimental/<method>/`: `opsd_config.py` (`OPSDConfig`), `opsd_trainer.py`
(`OPSDTrainer`) and `divergence.py` (the pure per-token JSD). This file registers the method.
"""

from __future__ import annotations

import importlib
import textwrap

from ..registry import Column, Method, Paper, register_method

# OPSD as the PPM paper defines and runs it: the card cites that paper (written here, as each TRL trainer carries its
# own citation, so this folder imports no other method's)
PAPER = Paper(
    "Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching", "2609.07303",
    textwrap.dedent("""\
        @article{ppm2026,
            title        = {{Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching}},
            author       = {Kevin Frans and Oleh Rybkin and Sergey Levine and Aviral Kumar and others},
            year         = 2026,
            eprint       = {arXiv:2609.07303}
        }"""))


def column_needs(args, custom_scorer: bool = False) -> dict[str, Column]:
    """The reference solution: the teacher's privileged context."""
    return {"reference": Column("str", "OPSD's teacher (the reference as privileged context)")}


register_method(Method("opsd", "ppm_trl.opsd.opsd_config:OPSDConfig", "ppm_trl.opsd.opsd_trainer:OPSDTrainer",
                       summary="OPSD (PPM paper's baseline): on-policy self-distillation from the starting policy "
                               "given the reference",
                       columns=column_needs, paper=PAPER, card_name="OPSD"))

_EXPORTS = {"OPSDConfig": "opsd_config", "OPSDTrainer": "opsd_trainer"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
