"""`ARGConfig`: the `GRPOConfig` of [`ARGTrainer`], every knob of the ARG paper a field (also a YAML key and a
`--flag` of `ppm-trl train`). `arg_mode`'s accepted values are `GuidanceMode`'s; the selector checks its own knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..configs import WholeGroupBatches, check_choice
from .guidance_step import GuidanceMode
from .selector import PrefixSelector

ARG_MODES = tuple(mode.value for mode in GuidanceMode)
ARG_MAX_ACCEPTED = 4  # ARG Table 4: at most 4 inserted trajectories in a group of G = 8


def arg_trl_defaults() -> dict:
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
                  "most num_generations - 1 (one original failure stays in the group); with arg_mode=resampling, "
                  "num_generations (App. G.2: resampling 'retains all correct candidate trajectories')."})
    arg_max_empty_prefix: int | None = field(
        default=None,
        metadata={"help": "Cap on accepted empty-prefix candidates. Default: 4 (Table 3); with arg_mode=resampling, "
                  "arg_max_accepted (no cap of its own: every candidate has the empty prefix)."})
    arg_max_guided: int = field(default=1, metadata={"help": "Cap on accepted non-empty-prefix candidates."})
    arg_selector_epsilon: float = field(default=0.2, metadata={"help": "ε, uniform mixing of the selector."})
    arg_selector_lr: float = field(default=0.3, metadata={"help": "η, the selector's REINFORCE step size."})
    arg_baseline_rate: float = field(default=0.1, metadata={"help": "β, the baseline's moving-average rate."})
    arg_mode: str = field(
        default="arg",
        metadata={
            "help": "`arg`; `reference_insertion` (ablation §5.3: insert the reference, no continuations); "
            "`resampling` (ablation §5.3, App. G.2: all K continuations from the empty prefix, every correct one "
            "accepted — caps default to num_generations — no reference fallback)."
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
    epsilon: float = arg_trl_defaults()["epsilon"]
    epsilon_high: float | None = arg_trl_defaults()["epsilon_high"]
    warmup_steps: float = arg_trl_defaults()["warmup_steps"]
    weight_decay: float = arg_trl_defaults()["weight_decay"]
    lr_scheduler_type: str = arg_trl_defaults()["lr_scheduler_type"]

    def __post_init__(self):
        super().__post_init__()
        check_choice("arg_mode", self.arg_mode, ARG_MODES)
        self.arg_levels = [float(level) for level in self.arg_levels]
        # The selector validates levels, ε, η and β with its own rules (ValueError naming the knob).
        PrefixSelector(self.arg_levels, self.arg_selector_epsilon, self.arg_selector_lr, self.arg_baseline_rate)
        if self.arg_num_continuations < 1:
            raise ValueError(f"arg_num_continuations must be >= 1, got {self.arg_num_continuations}")
        # App. G.2's resampling baseline keeps every correct candidate (a group may end all-correct: zero advantages,
        # as eq. 28 gives); ARG itself keeps at least one original failure.
        resampling = self.arg_mode == GuidanceMode.RESAMPLING.value
        most = self.num_generations if resampling else self.num_generations - 1
        if self.arg_max_accepted is None:
            self.arg_max_accepted = most if resampling else min(ARG_MAX_ACCEPTED, most)
        if self.arg_max_empty_prefix is None:
            self.arg_max_empty_prefix = self.arg_max_accepted if resampling else ARG_MAX_ACCEPTED
        if not 1 <= self.arg_max_accepted <= most:
            bound, why = (("num_generations", "with arg_mode=resampling, an inserted trajectory replaces an original "
                           "failure") if resampling else
                          ("num_generations - 1", "at least one original failure must stay in the group, or an "
                           "all-correct group has zero advantages (paper: 4 of G = 8)"))
            raise ValueError(f"arg_max_accepted must lie in [1, {bound} = {most}], got {self.arg_max_accepted}: {why}")
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
