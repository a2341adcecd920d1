"""`PPMConfig`: the `GRPOConfig` of [`PPMGRPOTrainer`], every knob of the PPM paper a field (also a YAML key and a
`--flag` of `ppm-trl train`). The variants' accepted values are the keys of their tables: `segmentation` of
`segmentation.SEGMENTATIONS`, `granularity` × `progress_mode` of `ppm_estimators.PPM_ESTIMATORS`, `progress_scorer`
of `progress_scorers.PROGRESS_SCORERS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..configs import WholeGroupBatches, check_choice
from ..judge.arguments import JudgeArguments
from .ppm_estimators import accepted_granularities, accepted_progress_modes, ppm_estimator
from .progress_scorers import PROGRESS_SCORERS
from .segmentation import SEGMENTATIONS, SegmentationSettings


@dataclass
class PPMConfig(JudgeArguments, WholeGroupBatches, GRPOConfig):
    r"""Configuration of [`PPMGRPOTrainer`] (Progressive Point Matching, paper §4–5, App. B).

    Segment k of a completion gets reward r_k = m_k − m_{k−1} (+ outcome), where m_k is the fraction of reference
    reasoning points reached by the prefix c_1..c_k after the obsoletion-graph closure; the advantage of every token
    of segment k is r_k minus the group mean of r_k (no std division by default). Training defaults follow the
    paper's Table 3 (lr 3e-6, 16 generations, clip 0.20/0.28, no KL, truncated completions masked, zero-advantage
    groups filtered) and App. B (tokens with a ≥ 2× train–inference probability mismatch are masked).
    """

    num_segments: int = field(default=4, metadata={"help": "K, the number of segments per completion (paper: 4)."})
    segmentation: str = field(
        default="equal_chunks",
        metadata={
            "help": "`equal_chunks`: K chunks of max_completion_length/K tokens (short completions have empty "
            "trailing segments); `turns`: each assistant turn of a tool/multi-turn rollout is a segment; "
            "`delimiter`: a segment ends at each match of `segment_delimiter` (one line per step)."
        },
    )
    segment_delimiter: str = field(
        default="\n",
        metadata={"help": "With segmentation=delimiter: the regular expression that closes a segment, matched on the "
                  "decoded completion (default a newline: one segment per line; pieces beyond num_segments join "
                  "the last)."},
    )
    granularity: str = field(
        default="segment",
        metadata={"help": "`segment`: per-segment rewards (PPM); `trajectory`: final progress broadcast (baseline)."},
    )
    progress_mode: str = field(
        default="ppm",
        metadata={
            "help": "`ppm`: cumulative prefix judged with shortcutting; `exact_order`: a point counts only when all "
            "earlier points are reached (baseline); `process_reward`: each chunk judged alone (baseline, App. B.1)."
        },
    )
    shortcutting: bool = field(
        default=True, metadata={"help": "Apply the obsoletion graph (reaching a point reaches what it obsoletes)."}
    )
    add_outcome_reward: bool = field(
        default=True, metadata={"help": "Add the outcome reward to every segment's reward (paper App. B)."}
    )
    outcome_weight: float = field(
        default=1.0, metadata={"help": "Weight of the outcome reward added to each segment (authors' GSM-Inf.: 2.0)."}
    )
    progress_scorer: str = field(
        default="programmatic",
        metadata={"help": "`programmatic` (env matchers, no LLM) or `judge` (LiteLLM, paper App. D prompt)."},
    )
    filter_zero_advantage_groups: bool = field(
        default=True,
        metadata={"help": "Drop groups whose advantages are all zero from the loss (paper App. B, after DAPO)."},
    )
    overlap_scoring: bool = field(
        default=True,
        metadata={"help": "Start the progress scorer's (judge's) requests as soon as a batch's completions exist, "
                  "while TRL computes the old/reference log-probs; the same grades. False: score after TRL's rewards."},
    )
    # Paper Table 3 / App. B defaults where they differ from TRL's.
    learning_rate: float = field(default=3e-6, metadata={"help": "Paper Table 3: 3e-6."})
    num_generations: int | None = field(default=16, metadata={"help": "Trajectories per prompt (paper: 16)."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Upper clip ratio (paper Table 3: 0.28)."})
    scale_rewards: str = field(
        default="none", metadata={"help": "PPM uses no std division (paper App. B); `group` to divide."}
    )
    mask_truncated_completions: bool = field(
        default=True, metadata={"help": "Mask completions truncated by the budget (paper App. B 'length filter')."}
    )
    vllm_importance_sampling_mode: str = field(
        default="token_mask",
        metadata={"help": "Paper App. B masks tokens with ≥ 2× train-inference mismatch: token_mask in [0.5, 2]."},
    )
    vllm_importance_sampling_clip_max: float | None = field(default=2.0, metadata={"help": "See mode (paper: 2)."})
    vllm_importance_sampling_clip_min: float | None = field(default=0.5, metadata={"help": "See mode (paper: 1/2)."})

    def __post_init__(self):
        super().__post_init__()
        if self.num_segments < 1:
            raise ValueError(f"num_segments must be >= 1, got {self.num_segments}")
        check_choice("segmentation", self.segmentation, SEGMENTATIONS)
        SEGMENTATIONS[self.segmentation].check(SegmentationSettings.of(self))  # e.g. a bad regex fails here
        check_choice("granularity", self.granularity, accepted_granularities())
        check_choice("progress_mode", self.progress_mode, accepted_progress_modes())
        check_choice("progress_scorer", self.progress_scorer, PROGRESS_SCORERS)
        if self.progress_mode != "ppm" and self.shortcutting:
            # The baselines are defined without shortcutting (paper App. B.1).
            self.shortcutting = False
        ppm_estimator(self.granularity, self.progress_mode)  # the pair must select an estimator: fail here
        if self.granularity == "segment":
            # These TRL options decide per sequence from the sign or the sum of its advantage; segment advantages
            # differ from token to token inside one completion, so the decision would be taken per token instead.
            per_sequence = {
                "off_policy_mask_threshold": (self.off_policy_mask_threshold is not None,
                                              "drops a sequence when its advantage is negative and its KL is high"),
                "loss_type='vespo'": (self.loss_type == "vespo",
                                      "picks its sequence weight from the sign of the sequence's advantage"),
                "loss_type='luspo'": (self.loss_type == "luspo",
                                      "scales one sequence-level ratio by the sequence's advantage"),
                "importance_sampling_level='sequence'": (self.importance_sampling_level == "sequence",
                                                         "(GSPO) clips one sequence-level ratio by the sign of the "
                                                         "sequence's advantage"),
            }
            for option, (chosen, why) in per_sequence.items():
                if chosen:
                    raise ValueError(f"PPM with granularity='segment' does not support {option}: it {why}, while "
                                     "segment advantages change sign inside a completion. Use granularity='trajectory' "
                                     "(one advantage per completion) or leave the option at its default.")
