"""VeriFree, the PPM paper's baseline (App. B.1, eq. 110): GRPO whose reward adds the policy's own likelihood of the
reference answer after the rollout's reasoning — no verifier of the rollout's own answer, which is discarded.

One folder, as TRL's `trl/experimental/<method>/`: `verifree_config.py` (`VerifreeConfig`), `verifree_trainer.py`
(`VerifreeTrainer`) and `likelihood.py` (the pure pieces: where a rollout's final output starts, the reference's
final output, exp of the mean log-likelihood). This file registers the method; the classes load on first use.
"""

from __future__ import annotations

import importlib
import textwrap

from ..registry import Column, Method, Paper, register_method

PAPER = Paper(
    "Reinforcing General Reasoning without Verifiers", "2505.21493",
    textwrap.dedent("""\
        @article{zhou2025verifree,
            title        = {{Reinforcing General Reasoning without Verifiers}},
            author       = {Xiangxin Zhou and others},
            year         = 2025,
            eprint       = {arXiv:2505.21493}
        }"""))


def column_needs(args, custom_scorer: bool = False) -> dict[str, Column]:
    """The reference solution, whose final output is the answer the policy's likelihood is read on."""
    return {"reference": Column("str", "VeriFree's reference-answer likelihood")}


register_method(Method("verifree", "ppm_trl.verifree.verifree_config:VerifreeConfig",
                       "ppm_trl.verifree.verifree_trainer:VerifreeTrainer",
                       summary="VeriFree (PPM paper's baseline): outcome + the policy's likelihood of the reference "
                               "answer after the rollout's reasoning",
                       columns=column_needs, paper=PAPER, card_name="VeriFree"))

_EXPORTS = {"VerifreeConfig": "verifree_config", "VerifreeTrainer": "verifree_trainer"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
