"""The statistics of `evidence.py`, pure: t intervals, paired gaps, censored samples-to-target, lr choices.

Conventions (issue 40 item 5): every interval is a two-sided 95 % Student-t interval with n − 1 degrees of freedom;
an interval of a rate is clipped to [0, 1] and of a difference of rates to [−1, 1]; a ratio's interval is taken on
log ratios (log-t) and exponentiated. A samples-to-target that a run never reaches is censored at the run's budget:
it is a bound, never a number.
"""

from __future__ import annotations

import math
import statistics

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (the standard table).
T975 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def t_interval(values: list[float], bounds: tuple[float, float] | None = None) -> tuple[float, list[float] | None]:
    """(mean, [low, high]) with a two-sided 95 % Student-t interval (n − 1 dof), clipped to `bounds`; None for
    fewer than two values."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    half = T975[min(len(values) - 2, len(T975) - 1)] * statistics.stdev(values) / math.sqrt(len(values))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return mean, [low, high]


def rate_interval(values: list[float]) -> tuple[float, list[float] | None]:
    """`t_interval` of rates (accuracies, pass@k), clipped to [0, 1]."""
    return t_interval(values, (0.0, 1.0))


def paired_gap(a: list[float], b: list[float]) -> dict:
    """a − b paired by seed (same seed, same prompts, same warm start): {"per_seed", "mean", "ci95"}, the interval
    clipped to [−1, 1] (a difference of rates)."""
    if len(a) != len(b):
        raise ValueError(f"paired_gap needs one value per seed on both sides, got {len(a)} and {len(b)}")
    per_seed = [x - y for x, y in zip(a, b)]
    mean, interval = t_interval(per_seed, (-1.0, 1.0))
    return {"per_seed": per_seed, "mean": mean, "ci95": interval}


def gap_triple(gap: dict) -> list[float | None]:
    """[mean, low, high] of a `paired_gap` (low/high None with one seed)."""
    return [gap["mean"], *(gap["ci95"] or [None, None])]


# ----------------------------------------------------------------------------------------- censored samples-to-target
def ratio_by_seed(slow: list[int | None], fast: list[int | None], budget: int) -> list[float | dict]:
    """Per seed, samples-to-target of `slow` (GRPO) over `fast` (PPM); None = never reached within `budget`.

    Both reached: the ratio. Only `fast` reached: {"lower": budget / fast} (the ratio is at least that). Only `slow`
    reached: {"upper": slow / budget}. Neither: {"censored": True} — the seed stays in the summary, bound-free. Both
    at 0 samples: {"at_start": True} — the warm start already meets the target at the first evaluation (the same
    for both arms: same warm start, prompts and seed), so there is no ratio."""
    out: list[float | dict] = []
    for s, f in zip(slow, fast):
        if 0 in (s, f):
            if (s, f) != (0, 0):
                raise ValueError(f"only one arm met the target before training ({s} vs {f} samples): both are "
                                 "evaluated on the same warm start, prompts and seed at step 0")
            out.append({"at_start": True})
        elif s is not None and f is not None:
            out.append(s / f)
        elif f is not None:
            out.append({"lower": budget / f})
        elif s is not None:
            out.append({"upper": s / budget})
        else:
            out.append({"censored": True})
    return out


def km_median(times: list[int | None], budget: int) -> int | None:
    """Kaplan–Meier median samples-to-target: the smallest observed time t with Ŝ(t) ≤ ½, where every run that never
    reached the target is censored at `budget` (after every observed time). None when fewer than half the runs reach
    the target: the median is then only known to exceed the budget."""
    reached = sorted(t for t in times if t is not None)
    if any(t > budget for t in reached):
        raise ValueError(f"a samples-to-target above the budget {budget}: {reached}")
    at_risk, survival = len(times), 1.0
    for t in sorted(set(reached)):
        events = reached.count(t)
        survival *= 1 - events / at_risk
        at_risk -= events
        if survival <= 0.5:
            return t
    return None


def share_reached_by(times: list[int | None], budgets: list[int]) -> dict[int, float]:
    """{budget: share of runs that reached the target within it} — the censoring-free curve."""
    return {b: sum(t is not None and t <= b for t in times) / len(times) for b in budgets}


def km_ratio(slow: list[int | None], fast: list[int | None], budget: int) -> float | dict | None:
    """KM median of `slow` over KM median of `fast`: a number, {"lower": x} when only `fast`'s median is within the
    budget, {"upper": x} when only `slow`'s is, None when neither is."""
    s, f = km_median(slow, budget), km_median(fast, budget)
    return ratio_by_seed([s], [f], budget)[0] if (s, f) != (None, None) else None


def log_t_ratio(ratios: list[float | dict]) -> dict:
    """Geometric mean and log-t 95 % interval of the exact per-seed ratios; the bounded ones are counted, not
    averaged (a bound is not a value)."""
    exact = [r for r in ratios if not isinstance(r, dict)]
    summary = {
        "exact": len(exact),
        "lower_bounds": sum(isinstance(r, dict) and "lower" in r for r in ratios),
        "upper_bounds": sum(isinstance(r, dict) and "upper" in r for r in ratios),
        "censored": sum(isinstance(r, dict) and r.get("censored", False) for r in ratios),
        "at_start": sum(isinstance(r, dict) and r.get("at_start", False) for r in ratios),
        "geometric_mean": None,
        "ci95": None,
    }
    if exact:
        log_mean, log_interval = t_interval([math.log(r) for r in exact])
        summary["geometric_mean"] = math.exp(log_mean)
        summary["ci95"] = None if log_interval is None else [math.exp(v) for v in log_interval]
    return summary


def fmt_ratio(r: float | dict | None) -> str:
    if r is None:
        return "both > budget"
    if not isinstance(r, dict):
        return f"{r:.2f}"
    if r.get("at_start"):
        return "both at step 0"
    return f"≥ {r['lower']:.2f}" if "lower" in r else f"≤ {r['upper']:.2f}" if "upper" in r else "censored"


# ------------------------------------------------------------------------------------------------------- lr choices
def tuning_noise(grid: dict[float, dict], eval_size: int) -> dict:
    """Whether the best lr of one arm's grid beats its runner-up beyond noise.

    `grid[lr]["per_seed"]` are the tuning seeds' final all-correct. Two standard errors of (best − runner-up): the
    seed-paired one (stdev of the per-seed differences / √k) and the binomial one of two independent means over
    k × `eval_size` prompts; the difference is "inside noise" when it is below twice the larger, or zero."""
    ranked = sorted(grid, key=lambda lr: grid[lr]["score"], reverse=True)
    if len(ranked) < 2:
        return {"difference": None, "se": None, "inside_noise": None}
    best, second = grid[ranked[0]]["per_seed"], grid[ranked[1]]["per_seed"]
    diffs = [a - b for a, b in zip(best, second)]
    se_seeds = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    p1, p2, k = statistics.fmean(best), statistics.fmean(second), len(best)
    se_binomial = math.sqrt(sum(min(1.0, max(0.0, p)) * (1 - min(1.0, max(0.0, p))) for p in (p1, p2)) / (k * eval_size))
    se = max(se_seeds, se_binomial)
    return {
        "runner_up": ranked[1],
        "difference": p1 - p2,
        "se": se,
        "se_seeds": se_seeds,
        "se_binomial": se_binomial,
        "inside_noise": abs(p1 - p2) < 2 * se or p1 == p2,  # a tie (0 ± 0: nothing learned at either lr) too
    }


def shared_lr(grids: dict[str, dict[float, dict]]) -> float | None:
    """The one lr every arm is also reported at: of the lrs in every arm's grid, the one with the highest mean over
    arms of the tuning score (final all-correct, ties by per-sub-problem accuracy). None while a grid is empty."""
    if not grids or any(not grid for grid in grids.values()):
        return None
    common = set.intersection(*(set(grid) for grid in grids.values()))
    if not common:
        return None
    return max(
        sorted(common),
        key=lambda lr: [statistics.fmean(column) for column in zip(*(grids[arm][lr]["score"] for arm in grids))],
    )
