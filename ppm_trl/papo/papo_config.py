"""`PAPOConfig`: the `GRPOConfig` of [`PAPOTrainer`], every knob of the PAPO paper a field (also a YAML key and a
`--flag` of `ppm-trl train`). The ablations' accepted values are the keys of their tables: `process_norm` of
`papo_estimators.PROCESS_NORMS`, `combine` of `papo_estimators.COMBINES`, `process_scorer` of
`process_scorers.PROCESS_SCORERS`, `rubric` of the judge's `PAPO_TIERS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..configs import WholeGroupBatches, check_choice, refuse_normalize_then_sum
from ..judge.arguments import JudgeArguments
from ..judge.prompts import PAPO_TIERS
from .papo_estimators import COMBINES, PROCESS_NORMS
from .process_scorers import PROCESS_SCORERS

RUBRICS = tuple(PAPO_TIERS)


@dataclass
class PAPOConfig(JudgeArguments, WholeGroupBatches, GRPOConfig):
    r"""Configuration of [`PAPOTrainer`] (PAPO, decoupled advantages, paper §4).

    A = A_out + λ·A_proc: A_out is the GRPO advantage of the binary outcome over the whole group; A_proc normalises
    the rubric score over the correct responses only (0 for incorrect ones, 0 for the group when fewer than two are
    correct). The judge is called for correct responses only; with `overlap_scoring` (default) it runs under TRL's
    log-prob passes.
    """

    process_weight: float = field(default=1.0, metadata={"help": "λ, the weight of A_proc (paper default 1)."})
    process_norm: str = field(
        default="correct_subset",
        metadata={"help": "`correct_subset` (PAPO) or `full` (Fullnorm ablation: incorrect count with r_proc = 0)."},
    )
    combine: str = field(
        default="decoupled",
        metadata={"help": "`decoupled` (A_out + λA_proc) or `multiplicative` (Mult ablation: r = r_out·r_proc)."},
    )
    rubric: str = field(default="three_tier", metadata={"help": "`three_tier` {0,.5,1} (default) or `five_tier`."})
    process_scorer: str = field(
        default="programmatic",
        metadata={"help": "`programmatic` (env point fraction, no LLM) or `judge` (LiteLLM rubric, PAPO A.3)."},
    )
    papo_epsilon: float = field(default=1e-6, metadata={"help": "ε in the advantage denominators."})
    correct_threshold: float = field(
        default=1.0,
        metadata={"help": "A response is correct (r_out = 1) when its weighted outcome reward is ≥ this value."},
    )
    overlap_scoring: bool = field(
        default=True,
        metadata={"help": "Compute the outcome rewards as soon as a batch's completions exist and start the process "
                  "scorer (the rubric judge) on the correct ones while TRL computes the old/reference log-probs; "
                  "the same rewards, grades and advantages. False: score after TRL's rewards."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("process_norm", self.process_norm, PROCESS_NORMS)
        check_choice("combine", self.combine, COMBINES)
        check_choice("rubric", self.rubric, RUBRICS)
        check_choice("process_scorer", self.process_scorer, PROCESS_SCORERS)
        if self.combine == "multiplicative":  # decoupled: A_out is TRL's normalize_then_sum advantage
            refuse_normalize_then_sum(self, "PAPO", "with combine='multiplicative': it normalises r_out·r_proc once, so "
                                      "there is no separate outcome advantage for the per-function normalisation to replace",
                                      "combine='decoupled'")
