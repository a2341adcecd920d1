"""Which horizons n to train at, read off the warm start's profile (sampled success and per-line accuracy by n).

A *cliff* is a horizon where sparse outcome RL is starved but not blind, and where every sub-problem can be
learned — the regime the PPM paper is about:

* base all-correct is low but non-zero (`cliff_min` ≤ rate ≤ `cliff_max`): some groups see a success, and the
  rate is not a handful of lucky samples;
* every line is learnable (each line's accuracy ≥ `min_line`): a line the warm start never gets right is a wall
  that no estimator climbs in a CPU budget, and a horizon behind a wall measures the wall, not the method;
* all-correct falls monotonically with n up to it (no horizon at or below it is an outlier of the sampler),
  within `monotone_tolerance` (two rates 0.020 and 0.031 from 256 prompts are the same rate).

Of the horizons that qualify, the largest (the lowest non-zero base rate) is the cliff. The *easy* horizon is
the largest n below the cliff whose all-correct rate is ≥ `easy_min`, where groups with several correct answers
are common (PAPO's process term needs ≥ 2 correct answers in a group). `choose_horizons` says why each horizon was
taken or passed over; the demo and the benchmarks print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HorizonRule:
    cliff_min: float = field(default=0.02, metadata={"help": "Lowest base all-correct rate of a cliff."})
    cliff_max: float = field(default=0.10, metadata={"help": "Highest base all-correct rate of a cliff."})
    min_line: float = field(default=0.2, metadata={"help": "Lowest per-line accuracy of a learnable horizon."})
    easy_min: float = field(default=0.25, metadata={"help": "Lowest base all-correct rate of the easy horizon."})
    monotone_tolerance: float = field(default=0.02, metadata={
        "help": "A rise of all-correct from one horizon to the next up to this much still counts as monotone."})


def choose_horizons(profile: dict[int, dict], rule: HorizonRule | None = None) -> tuple[dict[str, int | None], dict]:
    """({"cliff": n | None, "easy": n | None}, {n: reason}) from `profile[n] = {"all_correct", "per_point"}`.

    `per_point` is the list of per-line accuracies (lines 1..n). Pure: no model, no sampling.
    """
    rule = rule or HorizonRule()
    reasons: dict[int, str] = {}
    qualifying, monotone_so_far, lowest = [], True, None
    for n in sorted(profile):
        rate, lines = profile[n]["all_correct"], list(profile[n].get("per_point") or [])
        if lowest is not None and rate > lowest + rule.monotone_tolerance:
            monotone_so_far = False
        lowest = rate if lowest is None else min(lowest, rate)
        weakest = min(range(len(lines)), key=lines.__getitem__) if lines else None
        if rate == 0:
            reasons[n] = "not a cliff: all-correct is 0 (no group ever sees a success)"
        elif rate < rule.cliff_min:
            reasons[n] = f"not a cliff: all-correct {rate:.3f} < {rule.cliff_min} (a handful of lucky samples)"
        elif rate > rule.cliff_max:
            reasons[n] = f"not a cliff: all-correct {rate:.3f} > {rule.cliff_max}"
        elif weakest is None:
            reasons[n] = "not a cliff: no per-line accuracies"
        elif lines[weakest] < rule.min_line:
            reasons[n] = (f"not a cliff: line {weakest + 1} is right only {lines[weakest]:.3f} of the time "
                          f"(< {rule.min_line}: a wall, not a cliff)")
        elif not monotone_so_far:
            reasons[n] = "not a cliff: all-correct does not fall monotonically with n up to here"
        else:
            reasons[n] = (f"cliff candidate: all-correct {rate:.3f} in [{rule.cliff_min}, {rule.cliff_max}], every line ≥ "
                          f"{rule.min_line} (weakest: line {weakest + 1} at {lines[weakest]:.3f}), monotone")
            qualifying.append(n)
    cliff = max(qualifying) if qualifying else None
    if cliff is not None:
        reasons[cliff] = "CLIFF — " + reasons[cliff].removeprefix("cliff candidate: ") + "; the largest such n"
    below = [n for n in sorted(profile) if (cliff is None or n < cliff) and profile[n]["all_correct"] >= rule.easy_min]
    easy = max(below) if below else None
    if easy is not None:
        reasons[easy] = (f"EASY — all-correct {profile[easy]['all_correct']:.3f} ≥ {rule.easy_min} (groups with "
                         "several correct answers are common); the largest such n below the cliff")
    return {"cliff": cliff, "easy": easy}, reasons


def profile_warm_start(model_path: str, env: str, horizons, size: int, seed: int = 99) -> dict[int, dict]:
    """{n: evaluate_policy metrics (all_correct, per_subproblem, per_point)} of the warm start, one thread,
    deterministic (the same numbers wherever the same weights are loaded)."""
    from ..envs import make_dataset
    from .warmstart import completion_budget, deterministic_cpu, evaluate_policy, load_policy

    with deterministic_cpu():
        model, tokenizer = load_policy(model_path)
        return {n: evaluate_policy(model, tokenizer, make_dataset(env, n, size, seed=7_000 + n),
                                   completion_budget(env, n), seed=seed)
                for n in horizons}


def format_profile(profile: dict[int, dict], reasons: dict[int, str] | None = None) -> str:
    """One line per horizon: rates, per-line accuracies and (if given) why it was or was not chosen."""
    lines = []
    for n in sorted(profile):
        p = profile[n]
        per_line = " ".join(f"{a:.2f}" for a in p.get("per_point") or [])
        lines.append(f"  n={n:>2}: all-correct {p['all_correct']:.3f}, per-sub-problem {p['per_subproblem']:.3f}, "
                     f"lines [{per_line}]" + (f"\n        {reasons[n]}" if reasons and n in reasons else ""))
    return "\n".join(lines)


__all__ = ["HorizonRule", "choose_horizons", "format_profile", "profile_warm_start"]
