"""Configurations of the three trainers: `GRPOConfig` subclasses in which every paper knob is a field.

Each field is also a YAML key and a `--flag` of `ppm-trl train` (TRL's `TrlParser`). Where a paper's training
defaults differ from TRL's, the paper's value is the default here and the field says so in its help text.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

from trl import GRPOConfig

from .advantages import COMBINES, PROCESS_NORMS, ppm_estimator
from .judge.arguments import JudgeArguments  # noqa: F401  (defined with the judge; importable from here as before)
from .segments import compile_delimiter

PROGRESS_MODES = ("ppm", "exact_order", "process_reward")
SEGMENTATIONS = ("equal_chunks", "turns", "delimiter")
GRANULARITIES = ("segment", "trajectory")
RUBRICS = ("three_tier", "five_tier")
ARG_MODES = ("arg", "reference_insertion", "resampling")
ARG_MAX_ACCEPTED = 4  # ARG Table 4: at most 4 inserted trajectories in a group of G = 8
SCORERS = ("programmatic", "judge")  # PPM's progress_scorer, PAPO's process_scorer

logger = logging.getLogger(__name__)

# The settings that decide TRL's generation batch.
BATCH_KEYS = ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
              "generation_batch_size", "steps_per_generation")
# Set by none of these, gradient_accumulation_steps is derived (`fit_generation_batch`).
BATCH_CHOICES = ("gradient_accumulation_steps", "generation_batch_size", "steps_per_generation")


def fit_generation_batch(given: dict, defaults: dict, num_processes: int = 1,
                         flags: bool = False) -> tuple[dict, str | None]:
    """(settings to default, a line saying so) that make TRL's generation batch hold whole groups of
    `num_generations` completions; a ValueError naming the settings when the user's own settings cannot.

    The one rule for both the configs (`__post_init__`) and `ppm-trl train` (which prints the line). TRL's
    generation batch is per_device_train_batch_size × processes × steps_per_generation (default: the gradient
    accumulation steps) or `generation_batch_size`, and must be a multiple of num_generations: PPM's 16 against
    TRL's batch of 8 fails. When the user set none of gradient_accumulation_steps, generation_batch_size and
    steps_per_generation, gradient_accumulation_steps is derived: each optimizer step trains on whole groups,
    on-policy, with the per-device (memory) batch unchanged. `given` holds the user's values (None: not given;
    strings are read as integers); `flags`: the error spells the fix as `ppm-trl train` flags, else as Python
    keyword arguments.
    """
    def value(key):
        return int(given[key]) if given.get(key) is not None else defaults.get(key)

    def setting(name, number=None):
        if flags:
            return f"--{name}" + ("" if number is None else f" {number}")
        return name if number is None else f"{name}={number}"

    generations, per_device = value("num_generations"), value("per_device_train_batch_size")
    if not generations or generations < 1 or not per_device or per_device < 1:
        return {}, None  # the configs' own checks name these
    global_batch = per_device * num_processes
    processes = f"{num_processes} process{'es' * (num_processes != 1)}"
    if given.get("generation_batch_size") is not None:
        batch, how, flag = value("generation_batch_size"), "generation_batch_size", "generation_batch_size"
    elif given.get("steps_per_generation") is not None:
        steps = value("steps_per_generation")
        batch, flag = global_batch * steps, "steps_per_generation"
        how = f"per_device_train_batch_size={per_device} × {processes} × steps_per_generation={steps}"
    else:
        steps = value("gradient_accumulation_steps") or 1
        batch, flag = global_batch * steps, "gradient_accumulation_steps"
        how = f"per_device_train_batch_size={per_device} × {processes} × gradient_accumulation_steps={steps}"
    if batch % generations == 0:
        return {}, None
    fitting_steps = generations // math.gcd(global_batch, generations)
    if all(given.get(k) is None for k in BATCH_CHOICES):
        total = global_batch * fitting_steps
        return {"gradient_accumulation_steps": fitting_steps}, (
            f"num_generations={generations} completions per prompt do not fit a batch of per_device_train_batch_size="
            f"{per_device} × {processes}, so gradient_accumulation_steps={fitting_steps}: each optimizer step trains "
            f"on {total} completions ({total // generations} prompt(s) × {generations}); set "
            "gradient_accumulation_steps, per_device_train_batch_size or num_generations to choose otherwise")
    fix = (setting("generation_batch_size", global_batch * fitting_steps) if flag == "generation_batch_size"
           else setting(flag, fitting_steps))
    raise ValueError(f"the generation batch ({how} = {batch}) must be a multiple of num_generations={generations}, "
                     f"so that each prompt's {generations} completions are scored together; set {fix}, or "
                     f"{setting('per_device_train_batch_size', generations)}, or a {setting('num_generations')} that "
                     f"divides {batch}")


@dataclass
class WholeGroupBatches:
    """`gradient_accumulation_steps` unset (None) by default, so that a config can tell "not given" from 1: then it
    is derived so that TRL's generation batch holds whole groups (`fit_generation_batch`: PPM's 16 generations with
    TRL's per-device batch of 8 give 2), else TRL's default 1. A setting the user gave that cannot hold whole groups
    is a ValueError naming the settings. Put it before `GRPOConfig` in the bases: its `__post_init__` runs first."""

    gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={"help": "Optimizer steps' worth of batches accumulated before an update. Default: 1, or — when "
                  "none of gradient_accumulation_steps, generation_batch_size and steps_per_generation is set and "
                  "num_generations does not divide the batch — the smallest count whose batch holds whole groups "
                  "(PPM's 16 generations with a per-device batch of 8: 2)."},
    )

    def __post_init__(self):
        self._fit_whole_groups()
        super().__post_init__()

    def _fit_whole_groups(self) -> None:
        given = {key: getattr(self, key) for key in BATCH_KEYS}
        derived, note = fit_generation_batch(given, {"gradient_accumulation_steps": 1},
                                             int(os.environ.get("WORLD_SIZE", "1")))
        self.gradient_accumulation_steps = derived.get("gradient_accumulation_steps",
                                                       self.gradient_accumulation_steps or 1)
        if note and os.environ.get("RANK", "0") == "0":
            logger.warning("ppm_trl: %s", note)


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; accepted values: {', '.join(map(str, choices))}")


def _refuse_normalize_then_sum(config, method: str, why: str) -> None:
    if config.multi_objective_aggregation == "normalize_then_sum":
        raise ValueError(f"{method} does not support multi_objective_aggregation='normalize_then_sum': {why}. "
                         "Use the default 'sum_then_normalize'.")


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
        _check_choice("segmentation", self.segmentation, SEGMENTATIONS)
        if self.segmentation == "delimiter":
            compile_delimiter(self.segment_delimiter)  # a bad regex fails here, not at the first step
        _check_choice("granularity", self.granularity, GRANULARITIES)
        _check_choice("progress_mode", self.progress_mode, PROGRESS_MODES)
        _check_choice("progress_scorer", self.progress_scorer, SCORERS)
        if self.progress_mode != "ppm" and self.shortcutting:
            # The baselines are defined without shortcutting (paper App. B.1).
            self.shortcutting = False
        ppm_estimator(self.granularity, self.progress_mode)  # the pair must select an estimator: fail here
        _refuse_normalize_then_sum(self, "PPM", "the weighted outcome reward is added to every segment's progress "
                                   "reward before the per-segment group normalisation")
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
        _check_choice("process_norm", self.process_norm, PROCESS_NORMS)
        _check_choice("combine", self.combine, COMBINES)
        _check_choice("rubric", self.rubric, RUBRICS)
        _check_choice("process_scorer", self.process_scorer, SCORERS)
        _refuse_normalize_then_sum(self, "PAPO", "its outcome is the binary 1[weighted outcome ≥ correct_threshold] "
                                   "of the summed rewards, normalised once by A_out")


def _arg_trl_defaults() -> dict:
    """ARG's values of TRL fields (Table 4, eq. 29), written once. `ARGConfig` declares them, and a composed config
    declares them again where ARG's value must win: a dataclass takes a field's default from the last base that
    has the field, and every GRPOConfig subclass has all of TRL's. (Fresh `field`s each call: a dataclass owns its.)"""
    return dict(
        epsilon=field(default=0.2, metadata={"help": "Lower clip: ratio ≥ 0.8 (ARG eq. 29)."}),
        epsilon_high=field(default=0.3, metadata={"help": "Upper clip: ratio ≤ 1.3 (ARG eq. 29)."}),
        warmup_steps=field(default=10, metadata={"help": "ARG Table 4: 10 warmup updates."}),
        weight_decay=field(default=0.01, metadata={"help": "ARG Table 4: 0.01."}),
        lr_scheduler_type=field(default="constant_with_warmup", metadata={"help": "ARG: constant after warmup."}),
    )


@dataclass
class ARGConfig(WholeGroupBatches, GRPOConfig):
    r"""Configuration of [`ARGTrainer`] (Adaptive Reference Guidance, paper §3–4, Alg. 1, App. E).

    For every all-failure group, `arg_num_continuations` reference prefixes are drawn from a learned selector over
    surprisal levels α (prefix = latest t with S_t ≥ α·S_0, snapped to a boundary), continued by the policy, verified
    and accepted; accepted trajectories (or the reference as fallback) replace failed rows. Training defaults follow
    the paper's Tables 3–4 (lr 1e-6 constant after 10 warmup updates, weight decay 0.01, 8 responses, K = 8,
    levels {1, 1/2, 1/4}, caps 4/4/1, ε_sel 0.2, η_sel 0.3, β 0.1) and the clip interval [0.8, 1.3] of eq. (29).
    TRL's own defaults already match the rest of Table 3 (temperature 1, no KL, batch-token-mean loss, grad clip 1).
    """

    arg_levels: list[float] = field(
        default_factory=lambda: [1.0, 0.5, 0.25],
        metadata={"help": "Guidance levels α (1 = empty prefix); prefix leaves α·S_0 of the surprisal."},
    )
    arg_num_continuations: int = field(default=8, metadata={"help": "K continuations per all-failure group."})
    arg_max_accepted: int | None = field(
        default=None,
        metadata={"help": "At most this many inserted trajectories per group. Default: the paper's 4 (of G = 8), at "
                  "most num_generations - 1 (one original failure stays in the group)."})
    arg_max_empty_prefix: int = field(default=4, metadata={"help": "Cap on accepted empty-prefix candidates."})
    arg_max_guided: int = field(default=1, metadata={"help": "Cap on accepted non-empty-prefix candidates."})
    arg_selector_epsilon: float = field(default=0.2, metadata={"help": "ε, uniform mixing of the selector."})
    arg_selector_lr: float = field(default=0.3, metadata={"help": "η, the selector's REINFORCE step size."})
    arg_baseline_rate: float = field(default=0.1, metadata={"help": "β, the baseline's moving-average rate."})
    arg_mode: str = field(
        default="arg",
        metadata={
            "help": "`arg`; `reference_insertion` (ablation §5.3: insert the reference, no continuations); "
            "`resampling` (ablation §5.3: all K continuations from the empty prefix, correct ones accepted under the "
            "same caps, no reference fallback)."
        },
    )
    surprisal_weighting: bool = field(
        default=True,
        metadata={"help": "Selector feedback W = 1{correct and ≠ reference}·S_t/S_0 (eq. 7); off: the indicator."},
    )
    format_reward_weight: float = field(default=0.2, metadata={"help": "Reward = accuracy + this·format."})
    arg_skip_invalid_references: bool = field(
        default=False,
        metadata={"help": "Skip rows whose reference is missing/empty/unboxed (counted) instead of raising."},
    )
    arg_seed: int = field(
        default=0, metadata={"help": "Seed of the selector's level sampler and of the replacement positions."}
    )
    arg_min_continuation_tokens: int = field(
        default=16,
        metadata={"help": "A prefix leaves at least this many tokens of the budget to the continuation."},
    )
    arg_answer_marker: str = field(
        default="\\boxed", metadata={"help": "The final-answer marker a prefix must leave in the suffix (App. E.2)."}
    )
    # Paper defaults where they differ from TRL's.
    epsilon: float = _arg_trl_defaults()["epsilon"]
    epsilon_high: float | None = _arg_trl_defaults()["epsilon_high"]
    warmup_steps: float = _arg_trl_defaults()["warmup_steps"]
    weight_decay: float = _arg_trl_defaults()["weight_decay"]
    lr_scheduler_type: str = _arg_trl_defaults()["lr_scheduler_type"]

    def __post_init__(self):
        super().__post_init__()
        _check_choice("arg_mode", self.arg_mode, ARG_MODES)
        from .guidance import PrefixSelector  # pure module; imported here to keep this file's imports unchanged

        self.arg_levels = [float(level) for level in self.arg_levels]
        # The selector validates levels, ε, η and β with its own rules (ValueError naming the knob).
        PrefixSelector(self.arg_levels, self.arg_selector_epsilon, self.arg_selector_lr, self.arg_baseline_rate)
        if self.arg_num_continuations < 1:
            raise ValueError(f"arg_num_continuations must be >= 1, got {self.arg_num_continuations}")
        if self.arg_max_accepted is None:
            self.arg_max_accepted = min(ARG_MAX_ACCEPTED, self.num_generations - 1)
        if not 1 <= self.arg_max_accepted < self.num_generations:
            raise ValueError(
                f"arg_max_accepted must lie in [1, num_generations - 1 = {self.num_generations - 1}], got "
                f"{self.arg_max_accepted}: at least one original failure must stay in the group, or an all-correct "
                "group has zero advantages (paper: 4 of G = 8)"
            )
        if self.arg_max_empty_prefix < 0 or self.arg_max_guided < 0:
            raise ValueError(
                f"arg_max_empty_prefix and arg_max_guided must be >= 0, got {self.arg_max_empty_prefix}, "
                f"{self.arg_max_guided}"
            )
        if not 1 <= self.arg_min_continuation_tokens <= self.max_completion_length:
            raise ValueError(
                f"arg_min_continuation_tokens must lie in [1, max_completion_length = {self.max_completion_length}], "
                f"got {self.arg_min_continuation_tokens}"
            )
        if not self.arg_answer_marker:
            raise ValueError("arg_answer_marker must be a non-empty string such as '\\boxed'")


@dataclass
class PPMARGConfig(PPMConfig, ARGConfig):
    r"""Configuration of [`PPMARGTrainer`]: ARG's reference guidance for all-failure groups, then PPM's credit.

    Every field of [`PPMConfig`] and [`ARGConfig`]. Where both papers set a TRL default, PPM's wins (it decides the
    advantages): lr 3e-6, 16 generations, clip 0.20/0.28, no std division, masked truncations. The schedule (10
    warmup updates, then constant; weight decay 0.01) and the guidance knobs (levels, caps, selector) are ARG's.
    """

    warmup_steps: float = _arg_trl_defaults()["warmup_steps"]
    weight_decay: float = _arg_trl_defaults()["weight_decay"]
    lr_scheduler_type: str = _arg_trl_defaults()["lr_scheduler_type"]


@dataclass
class PAPOARGConfig(PAPOConfig, ARGConfig):
    r"""Configuration of [`PAPOARGTrainer`]: ARG's reference guidance for all-failure groups, then PAPO's credit.

    Every field of [`PAPOConfig`] and [`ARGConfig`]. PAPO sets no TRL default of its own, so the optimisation
    defaults are ARG's: lr 1e-6 (TRL's), 8 generations, clip [0.8, 1.3] (eq. 29), 10 warmup updates then constant,
    weight decay 0.01.
    """

    epsilon: float = _arg_trl_defaults()["epsilon"]
    epsilon_high: float | None = _arg_trl_defaults()["epsilon_high"]
    warmup_steps: float = _arg_trl_defaults()["warmup_steps"]
    weight_decay: float = _arg_trl_defaults()["weight_decay"]
    lr_scheduler_type: str = _arg_trl_defaults()["lr_scheduler_type"]
