"""Adaptive Reference Guidance ("Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning
RL"): GRPO whose all-failure groups receive reference-guided trajectories.

One folder, as TRL's `trl/experimental/<method>/`: `arg_config.py` (`ARGConfig`), `arg_trainer.py` (`ARGTrainer`),
and ARG's pure core (torch + stdlib, no TRL), the names DESIGN.md's Public API imports from `ppm_trl.arg`:
`surprisal.py` (S_t and the prefix a level asks for, §3.3, §4.1), `prefixes.py` (boundary snapping and the budget,
App. E.2), `selector.py` (`PrefixSelector`, eqs. 11, 12, 18), `acceptance.py` (feedback W, eq. 7, and the
acceptance rule, §4.3), `references.py` (references that can guide, App. E.1) and `guidance_step.py` (one step of
Algorithm 1 as data). This file registers the method; every name below is imported on first use, so
`import ppm_trl` stays free of torch and `from ppm_trl.arg import PrefixSelector` free of TRL.
"""

from __future__ import annotations

import importlib
import textwrap

from ..registry import Column, Method, Paper, register_method

PAPER = Paper(
    "Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning RL", "2610.11128",
    textwrap.dedent("""\
        @article{wang2026balancing,
            title        = {{Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning RL}},
            author       = {Hanyu Wang and Nakul Agarwal and Hossein Nourkhiz Mahjoub and Ehsan Moradi Pari and Makoto Fukushima and Jinghui Chen and Vaishnav Tadiparthi},
            year         = 2026,
            eprint       = {arXiv:2610.11128}
        }"""))


def column_needs(args, custom_scorer: bool = False) -> dict[str, Column]:
    # The ARG trainer checks each reference's final-answer marker itself (`arg_skip_invalid_references`).
    return {"reference": Column("any", "ARG (reference-guided continuations)")}


def run_totals(trainer, history: list[dict]) -> dict:
    """The guidance a run did (summed over its logged steps) and the selector's final probabilities per level."""
    selector = getattr(trainer, "prefix_selector", None)
    if selector is None:
        return {}
    return {"guidance_totals": {name: sum(entry.get(f"arg/{name}", 0.0) for entry in history)
                                for name in ("all_failure_groups", "groups_with_accepted", "fallback_groups",
                                             "inserted_rows")},
            "selector_probs": dict(zip(map(str, selector.levels), selector.probs().tolist()))}


register_method(Method("arg", "ppm_trl.arg.arg_config:ARGConfig", "ppm_trl.arg.arg_trainer:ARGTrainer",
                       extra_rewards=("format",),
                       summary="Adaptive Reference Guidance for all-failure groups (reward: accuracy + "
                               "format_reward_weight·format)",
                       columns=column_needs, paper=PAPER, card_name="ARG", run_totals=run_totals))

# name → the module of this folder that defines it
_EXPORTS = {name: module for module, names in {
    "surprisal": ("check_alpha", "suffix_surprisals", "batched_surprisal_prefix_lengths", "surprisal_prefix_length"),
    "prefixes": ("boundary_char_positions", "valid_prefix_cuts", "snap_prefix_length", "prefix_budget",
                 "GuidedPrefix", "EMPTY_PREFIX", "plan_reference_prefixes"),
    "selector": ("PrefixSelector", "mean_feedback_per_level"),
    "acceptance": ("continuation_feedback", "Candidate", "accept_candidates", "choose_replacement_rows"),
    "references": ("reference_problem", "check_references"),
    "guidance_step": ("GuidanceMode", "GroupStatus", "GroupPlan", "all_failure_groups", "FailedGroup", "FailureScan",
                      "scan_failures", "screen_reference", "plan_guided_group", "VerifiedContinuation",
                      "ContinuationOutcome", "GroupOutcome", "resolve_group", "selector_feedback", "guidance_metrics"),
    "arg_config": ("ARGConfig", "ARG_MODES", "ARG_MAX_ACCEPTED"),
    "arg_trainer": ("ARGTrainer", "SELECTOR_STATE_FILE"),
}.items() for name in names}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
