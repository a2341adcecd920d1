"""Progressive Point Matching ("Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching"):
GRPO whose rewards are per segment and whose advantages are per token.

One folder, as TRL's `trl/experimental/<method>/`: `ppm_config.py` (`PPMConfig`), `ppm_trainer.py`
(`PPMGRPOTrainer`), and the pure pieces only PPM uses — `segmentation.py` (the K segments of a completion),
`progress_scorers.py` (the (N, K) progress m_k, programmatic or judged) and `ppm_estimators.py` (its advantages).
This file registers the method; the classes are imported on first use, so `import ppm_trl` stays free of TRL.
"""

from __future__ import annotations

import importlib
import textwrap

from ..registry import Column, Method, Paper, register_method

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
    """The rubric points for the built-in scorers, and the env's name for the programmatic one (its matchers);
    nothing when the trainer got its own scorer (the trainer itself reads no column: e.g. environment data)."""
    if custom_scorer:
        return {}
    needs = {"reasoning_points": Column("list", "PPM")}
    if getattr(args, "progress_scorer", None) == "programmatic":
        needs["env"] = Column("any", "PPM's programmatic progress scorer (`progress_scorer: programmatic`)")
    return needs


def stalled(history: list[dict], args) -> str | None:
    """Why a PPM run learned nothing: every group had zero advantage and was dropped (`filter_zero_advantage_groups`)."""
    filtered = [entry["ppm/frac_rows_filtered"] for entry in history
                if isinstance(entry.get("ppm/frac_rows_filtered"), (int, float))]
    if filtered and min(filtered) >= 1.0:
        return ("every group had zero advantage (all its completions earned the same rewards) and was dropped "
                "(filter_zero_advantage_groups); check the reward and judge metrics — a model that never earns any "
                "reward (an untrained one) gives no learning signal")
    return None


def multiturn_fields(n: int) -> dict:
    """A multi-turn rollout of n sub-problems (`envs/multiturn.py`): segment k is turn k (the paper's segments by
    turn boundaries)."""
    return {"segmentation": "turns", "num_segments": n}


register_method(Method("ppm", "ppm_trl.ppm.ppm_config:PPMConfig", "ppm_trl.ppm.ppm_trainer:PPMGRPOTrainer",
                       summary="Progressive Point Matching: segment rewards, per-token advantages",
                       columns=column_needs, paper=PAPER, card_name="PPM-GRPO", stalled=stalled,
                       multiturn_fields=multiturn_fields))

_EXPORTS = {"PPMConfig": "ppm_config", "PPMGRPOTrainer": "ppm_trainer"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
