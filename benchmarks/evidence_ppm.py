"""`evidence.py`'s PPM parts: GRPO vs trajectory-level vs line-segment PPM by horizon, tuned at every horizon.

* **ppm** on `multi_add` from the pinned warm start, at every horizon of `--horizons`: GRPO, trajectory-level PPM
  and line segments with the answer line a segment of its own (`LINES`); at the hardest horizon also equal chunks
  and line segments whose answer shares the last line's segment (`lines`, where the answer format was lost).
* **ppm_robust** on `chain_add`, whose warm start learned from clean references (its cliff is a competence limit):
  the recipe, or the same SFT stopped earlier (longest first), the first whose profile has a cliff
  (`--robust-sft-steps`); GRPO and line segments at the same horizons.

Each arm gets its own lr grid at every horizon (issue 40 item 1) and is reported twice: at its own best lr, and
with every arm at one shared lr (`evidence_stats.shared_lr`). Samples-to-target is censored at the budget and
summarised without dropping a seed: per-seed ratios with bounds, Kaplan–Meier medians, the share of seeds reaching
the target by each budget.
"""

from __future__ import annotations

import os
import re
import statistics

from common import markdown_table, samples_to_target
from evidence_protocol import (
    Runner,
    final,
    fmt,
    fmt_gap,
    fmt_interval,
    grid_table,
    logged_mean,
    mean_or_none,
    pinned_warm_start,
    samples_per_step,
    save_figure,
    spec,
    tune,
)
from evidence_stats import (
    fmt_ratio,
    gap_triple,
    km_median,
    km_ratio,
    log_t_ratio,
    paired_gap,
    rate_interval,
    ratio_by_seed,
    share_reached_by,
    shared_lr,
)

from ppm_trl.demo import VARIANT_LABELS, choose_horizons
from ppm_trl.demo.runs import KEPT_COMPLETIONS as KEPT
from ppm_trl.demo.warmstart import WarmStartSettings

# The line-segment arm gives the answer line a segment of its own (`lines_answer`, K = n + 1): with K = n the answer
# shared the last line's segment, a right last line credited a garbled answer, and the answer format was lost at
# n = 8 (issue 40 item 2; the K = n arm stays at the hardest horizon, where it was diagnosed).
LINES = "lines_answer"
PPM_VARIANTS = ["sparse", "trajectory", LINES]
# equal chunks, one segment per line with K = n, and the PPM paper's VeriFree and OPSD baselines: at the hardest
# horizon only
PPM_HARDEST_ONLY = ["segment", "lines", "verifree", "opsd"]
ROBUST_VARIANTS = ["sparse", LINES]
LR_CHOICES = ("own", "shared")


def ppm_part(args, summary: dict, tables: list[str]) -> None:
    env, horizons = "multi_add", sorted(args.horizons)
    path, fingerprint, profile = pinned_warm_start(args, env, horizons)
    summary["warm_start_fingerprint"] = fingerprint
    summary["ppm"] = compare(
        args,
        Runner(args, env, path),
        env,
        fingerprint,
        profile,
        horizons,
        PPM_VARIANTS,
        PPM_HARDEST_ONLY,
        tables,
        "PPM",
    )


def ppm_robust_part(args, summary: dict, tables: list[str]) -> None:
    """PPM's comparison again on `chain_add`, each arm tuned on this task at every horizon."""
    env = "chain_add"
    profile_horizons = [1, 2] if args.quick else list(range(2, 9))
    recipe_steps = WarmStartSettings.for_env(env).max_steps
    tried = {}
    for sft_steps in args.robust_sft_steps:
        label = "" if sft_steps == recipe_steps else f"_sft{sft_steps}"
        # a candidate whose stored profile has no cliff is not rebuilt (each is ~20 min of SFT on a fresh machine)
        path, fingerprint, profile = pinned_warm_start(
            args, env, profile_horizons, label, profile_only=True, max_steps=sft_steps
        )
        chosen, reasons = choose_horizons({n: first_line_only(profile[n]) for n in profile_horizons})
        used = chosen["cliff"] is not None or args.quick
        if used and not path and not args.plan_only:
            path, _, _ = pinned_warm_start(args, env, profile_horizons, label, max_steps=sft_steps)
        tried[str(sft_steps)] = {
            "warm_start_fingerprint": fingerprint,
            "cliff": chosen["cliff"],
            "profile": {str(k): profile[k] for k in profile_horizons},
            "horizon_reasons": reasons,
        }
        if used:
            break
    robust = {
        "task": env,
        "sft_steps": sft_steps,
        "warm_starts_tried": tried,
        "warm_start_fingerprint": fingerprint,
        "horizon_reasons": reasons,
        "cliff": 2 if args.quick else chosen["cliff"],
    }
    summary["ppm_robust"] = robust
    if robust["cliff"] is None:
        robust["result"] = f"no cliff by the horizon rule at any of SFT steps {args.robust_sft_steps}: nothing measured"
        return
    horizons = sorted(args.horizons)
    runner = Runner(args, env, path, env + label)
    robust.update(
        compare(
            args,
            runner,
            env,
            fingerprint,
            profile,
            horizons,
            ROBUST_VARIANTS,
            [],
            tables,
            f"PPM robustness ({env}, clean references, {sft_steps} SFT steps, cliff at n = {robust['cliff']})",
        )
    )


def first_line_only(entry: dict) -> dict:
    """chain_add's lines are chained (line k is right only while the running value is), so its last line is right
    about as often as the whole answer and the per-line floor that tells a wall from a cliff on independent lines
    would refuse every chain_add cliff. The floor is applied to line 1, the only line that stands alone; the
    all-correct window and the monotone fall apply as on multi_add."""
    return {**entry, "per_point": list(entry.get("per_point") or [])[:1]}


# ------------------------------------------------------------------------------------------------------ comparison
def compare(
    args,
    runner: Runner,
    env: str,
    fingerprint: str,
    profile: dict,
    horizons: list[int],
    variants: list[str],
    hardest_only: list[str],
    tables: list[str],
    title: str,
) -> dict:
    """Tune every arm at every horizon (hardest first), report each at its own best lr and all at the shared lr."""
    hardest, steps, budget = horizons[-1], args.ppm_steps, args.ppm_steps * samples_per_step(args)
    arms = {n: variants + (hardest_only if n == hardest else []) for n in horizons}
    tuned = {n: tune(args, runner, arms[n], n, steps) for n in sorted(horizons, reverse=True)}
    for n in sorted(horizons, reverse=True):
        tables.append(grid_table(f"{title}: lr grid at n = {n}", tuned[n], n))
    tables.append(answer_format_table(args, runner, tuned[hardest], hardest, steps, title))
    lrs = {
        n: {
            "own": {v: tuned[n][v]["best"] for v in arms[n]},
            "shared": dict.fromkeys(arms[n], shared_lr({v: tuned[n][v]["grid"] for v in arms[n]})),
        }
        for n in horizons
    }
    out = {
        "task": env,
        "warm_start_fingerprint": fingerprint,
        "horizons": horizons,
        "hardest_n": hardest,
        "reporting_seeds": args.seeds,
        "tuning_seeds": args.tuning_seeds,
        "steps": steps,
        "samples_budget": budget,
        "target_line": args.target_line,
        "lr_grid": {v: sorted(info["grid"]) for v, info in tuned[hardest].items()},
        "best_lr": {v: info["best"] for v, info in tuned[hardest].items()},
        "best_lr_at_edge": any(info["at_edge"] for info in tuned[hardest].values()),
        "lr_grid_by_n": {str(n): {v: sorted(info["grid"]) for v, info in tuned[n].items()} for n in horizons},
        "best_lr_by_n": {str(n): lrs[n]["own"] for n in horizons},
        "shared_lr_by_n": {str(n): lrs[n]["shared"][variants[0]] for n in horizons},
        "tuning_noise_by_n": {str(n): {v: info.get("noise") for v, info in tuned[n].items()} for n in horizons},
        "profile": {str(n): profile[n] for n in horizons},
    }
    if args.tune_only or any(lr is None for n in horizons for choice in LR_CHOICES for lr in lrs[n][choice].values()):
        return out
    wanted = {(v, n, lrs[n][choice][v]) for n in horizons for v in arms[n] for choice in LR_CHOICES}
    runs = runner.run([spec(args, v, n, lr, s, steps) for v, n, lr in sorted(wanted) for s in args.seeds])
    if len(runs) < len(wanted) * len(args.seeds):
        return out
    by_n = {
        n: {
            choice: {
                v: cell(args, [runs[(v, n, lrs[n][choice][v], s)] for s in args.seeds], n, budget) for v in arms[n]
            }
            for choice in LR_CHOICES
        }
        for n in horizons
    }
    for n in horizons:
        for choice in LR_CHOICES:
            cells = by_n[n][choice]
            cells["gap"] = paired_gap(cells[LINES]["final_all_correct"], cells["sparse"]["final_all_correct"])
            cells["gap_greedy"] = paired_gap(
                cells[LINES]["final_greedy_all_correct"], cells["sparse"]["final_greedy_all_correct"]
            )
    own, shared = ({n: by_n[n][choice] for n in horizons} for choice in LR_CHOICES)
    reached = {n: {v: own[n][v]["samples_to_target"] for v in arms[n]} for n in horizons}
    ratios = {n: ratio_by_seed(reached[n]["sparse"], reached[n][LINES], budget) for n in horizons}
    km = {n: {v: km_median(reached[n][v], budget) for v in arms[n]} for n in horizons}
    hardest_ratio = log_t_ratio(ratios[hardest])
    out.update(
        # each arm at its own best lr tuned at that n
        gap_by_n={str(n): own[n]["gap"]["mean"] for n in horizons},
        gap_by_n_greedy={str(n): own[n]["gap_greedy"]["mean"] for n in horizons},
        gap_ci95_by_n={str(n): own[n]["gap"]["ci95"] for n in horizons},
        gap_ci95_by_n_greedy={str(n): own[n]["gap_greedy"]["ci95"] for n in horizons},
        matched_gap_ci95_by_n={str(n): own[n]["gap"]["ci95"] for n in horizons},
        gap_paired_by_n={str(n): gap_triple(own[n]["gap"]) for n in horizons},
        # every arm at the shared lr
        matched_lr={
            str(n): {v: statistics.fmean(shared[n][v]["final_all_correct"]) for v in arms[n]} for n in horizons
        },
        shared_gap_paired_by_n={str(n): gap_triple(shared[n]["gap"]) for n in horizons},
        shared_gap_paired_by_n_greedy={str(n): gap_triple(shared[n]["gap_greedy"]) for n in horizons},
        # samples-to-target (GRPO / line segments), censored at the budget, no seed dropped
        ratio_by_seed={str(n): ratios[n] for n in horizons},
        km_median={str(n): km[n] for n in horizons},
        km_median_ratio={str(n): km_ratio(reached[n]["sparse"], reached[n][LINES], budget) for n in horizons},
        share_reached_by_budget={
            str(n): {v: share_reached_by(reached[n][v], budget_marks(args)) for v in arms[n]} for n in horizons
        },
        ratio_per_seed=ratios[hardest],
        ratio_median=km_ratio(reached[hardest]["sparse"], reached[hardest][LINES], budget),
        ratio_ci95=hardest_ratio["ci95"],
        ratio_geometric_mean=hardest_ratio["geometric_mean"],
        ratio_summary=hardest_ratio,
        censored=any(s is None for s in reached[hardest]["sparse"]),
        ppm_censored=any(s is None for s in reached[hardest][LINES]),
        grpo_reached_target_at=[n for n in horizons if any(s is not None for s in reached[n]["sparse"])],
        details={str(n): {"own": own[n], "shared": shared[n]} for n in horizons},
    )
    tables.extend(comparison_tables(args, out, by_n, arms, title))
    plot_ppm(args, out, own, horizons, env)
    return out


def cell(args, results: list[dict], n: int, budget: int) -> dict:
    """One arm at one lr and horizon over the reporting seeds."""
    target = args.target_line**n
    return {
        "lr": results[0]["spec"]["learning_rate"],
        "final_all_correct": [final(r) for r in results],
        "final_greedy_all_correct": [final(r, "greedy_all_correct") for r in results],
        "final_per_subproblem": [final(r, "per_subproblem") for r in results],
        "start_all_correct": results[0]["history"][0]["all_correct"],
        "start_greedy_all_correct": results[0]["history"][0]["greedy_all_correct"],
        "samples_to_target": [samples_to_target(r["history"], target) for r in results],
        "trainable_fraction": mean_or_none(trainable_fraction(r) for r in results),
        "final_clipped_ratio": mean_or_none(clipped_ratio(r) for r in results),
        "final_answer_form": mean_or_none(answer_form(r, n) for r in results),
    }


_LABELLED_BOX = re.compile(r"\\boxed\{([a-z])=-?\d+((?:,[a-z]=-?\d+)*)\}")
_NUMBER_BOX = re.compile(r"\\boxed\{-?\d+\}")


def answer_form(result: dict, n: int) -> float | None:
    """Share of the last evaluation's kept completions (T = 1) whose last line is a well-formed answer: `multi_add`'s
    box of n `label=integer` items with distinct labels, or `chain_add`'s `\\boxed{integer}` — right or wrong. The
    answer format, read from the run file (issue 40 item 2: the n = 8 format loss)."""
    kept = result["history"][-1].get("completions")
    if not kept:
        return None

    def well_formed(text: str) -> bool:
        last = (text.strip().split("\n") or [""])[-1].strip()
        if _NUMBER_BOX.fullmatch(last):
            return True
        if not _LABELLED_BOX.fullmatch(last):
            return False
        labels = [item.split("=")[0] for item in last[len("\\boxed{"):-1].split(",")]
        return len(labels) == n == len(set(labels))

    return sum(well_formed(c["completion"]) for c in kept) / len(kept)


def answer_format_table(args, runner: Runner, tuned: dict, n: int, steps: int, title: str) -> str:
    """Every tuning run at the hardest n: lines right, all right, answer well-formed, clipped — where the answer format
    is lost, and at which lrs (the runs are cached: this trains nothing new)."""
    specs = [spec(args, v, n, lr, s, steps) for v, info in tuned.items() for lr in sorted(info["grid"])
             for s in args.tuning_seeds]
    runs = runner.run(specs)
    rows = [[VARIANT_LABELS[x.variant], f"{x.learning_rate:g}", str(x.seed),
             f"{final(r, 'per_subproblem'):.3f}", f"{final(r):.3f}", fmt(answer_form(r, n)), fmt(clipped_ratio(r))]
            for x in specs if (r := runs.get((x.variant, x.n, x.learning_rate, x.seed))) is not None]
    return (f"### {title}: the answer format at n = {n} (every tuning run; last evaluation, T = 1)\n\n"
            + markdown_table(["variant", "lr", "tuning seed", "lines right", "all right",
                              f"well-formed answer line ({KEPT} kept completions)", "clipped ratio, last window"],
                             rows))


def trainable_fraction(result: dict) -> float | None:
    """Share of groups with a non-zero advantage over training (PPM logs it; for GRPO, 1 − zero-std share)."""
    ppm = logged_mean(result, "ppm/frac_groups_nonzero_advantage")
    if ppm is not None:
        return ppm
    zero = logged_mean(result, "frac_reward_zero_std")
    return None if zero is None else 1 - zero


def clipped_ratio(result: dict) -> float | None:
    """Share of completions cut at the length limit in the last logging window (a format loss shows here)."""
    logs = [log for log in result.get("train_logs", []) if "completions/clipped_ratio" in log]
    return logs[-1]["completions/clipped_ratio"] if logs else None


def budget_marks(args) -> list[int]:
    """The budgets at which the share of seeds reaching the target is read: every evaluation."""
    return [step * samples_per_step(args) for step in range(args.eval_every, args.ppm_steps + 1, args.eval_every)]


def comparison_tables(args, out: dict, by_n: dict, arms: dict, title: str) -> list[str]:
    budget, horizons = out["samples_budget"], out["horizons"]
    rows = []
    for n in horizons:
        for v in arms[n]:
            own, shared = by_n[n]["own"][v], by_n[n]["shared"][v]
            rows.append(
                [
                    str(n),
                    f"{args.target_line**n:.3f}",
                    VARIANT_LABELS[v],
                    f"{own['start_all_correct']:.3f} / {own['start_greedy_all_correct']:.3f}",
                    f"{own['lr']:g}",
                    fmt_interval(own["final_all_correct"]),
                    fmt_interval(own["final_greedy_all_correct"]),
                    fmt_interval(own["final_per_subproblem"]),
                    f"{shared['lr']:g}",
                    fmt_interval(shared["final_all_correct"]),
                    fmt_interval(shared["final_greedy_all_correct"]),
                    fmt(own["trainable_fraction"]),
                    fmt(own["final_clipped_ratio"]),
                    fmt(own["final_answer_form"]),
                ]
            )
    main = (
        f"### {title} by horizon (warm start {out['warm_start_fingerprint']}; {len(args.seeds)} reporting seeds, "
        f"{args.eval_size} held-out prompts; {budget} samples per run; mean [t 95 % interval, clipped to [0, 1]])"
        "\n\n"
        + markdown_table(
            [
                "n",
                "target",
                "variant",
                "step-0 all-correct (T=1 / greedy)",
                "own best lr",
                "final T=1",
                "final greedy",
                "final per-sub-problem",
                "shared lr",
                "final T=1 (shared)",
                "final greedy (shared)",
                "groups with a non-zero advantage",
                "clipped ratio, last window",
                f"well-formed answer line ({KEPT} kept)",
            ],
            rows,
        )
    )
    gap_rows = [
        [
            str(n),
            fmt_gap(by_n[n]["own"]["gap"]),
            fmt_gap(by_n[n]["own"]["gap_greedy"]),
            fmt_gap(by_n[n]["shared"]["gap"]),
            fmt_gap(by_n[n]["shared"]["gap_greedy"]),
        ]
        for n in horizons
    ]
    gaps = (
        f"### {title}: final all-correct gap, line segments − GRPO, paired by seed (mean [t 95 % interval, "
        f"{len(args.seeds) - 1} dof])\n\n"
        + markdown_table(
            ["n", "each at own lr, T = 1", "each at own lr, greedy", "shared lr, T = 1", "shared lr, greedy"], gap_rows
        )
    )
    reach_rows = []
    for n in horizons:
        for v in arms[n]:
            times = by_n[n]["own"][v]["samples_to_target"]
            share = out["share_reached_by_budget"][str(n)][v]
            reach_rows.append(
                [
                    str(n),
                    VARIANT_LABELS[v],
                    " ".join(f">{budget}" if t is None else str(t) for t in times),
                    f">{budget}" if out["km_median"][str(n)][v] is None else str(out["km_median"][str(n)][v]),
                    " ".join(f"{share[b]:.2f}" for b in sorted(share)),
                ]
            )
        reach_rows.append(
            [
                str(n),
                "GRPO / line segments",
                " ".join(fmt_ratio(r) for r in out["ratio_by_seed"][str(n)]),
                fmt_ratio(out["km_median_ratio"][str(n)]),
                "",
            ]
        )
    summary_ = out["ratio_summary"]
    reach = (
        f"### {title}: samples to the target (target_line^n), each arm at its own lr; censored at {budget}\n\n"
        + markdown_table(
            [
                "n",
                "arm",
                "per seed",
                "Kaplan–Meier median",
                "share of seeds reached by " + ", ".join(str(b) for b in budget_marks(args)),
            ],
            reach_rows,
        )
        + f"\n\nAt n = {out['hardest_n']}: {summary_['exact']} exact ratios (geometric mean "
        f"{fmt(summary_['geometric_mean'], 2)}, log-t 95 % interval "
        f"{'–' if summary_['ci95'] is None else '[{:.2f}, {:.2f}]'.format(*summary_['ci95'])}), "
        f"{summary_['lower_bounds']} lower bounds, {summary_['upper_bounds']} upper bounds, "
        f"{summary_['censored']} seeds censored on both arms, {summary_['at_start']} seeds where both arms met the "
        f"target at step 0 (no ratio); ratio of Kaplan–Meier medians "
        f"{fmt_ratio(out['ratio_median'])}."
    )
    return [main, gaps, reach]


def plot_ppm(args, out: dict, own: dict, horizons: list[int], env: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = out["samples_budget"]
    variants = [v for v in PPM_VARIANTS if v in own[horizons[0]]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for variant in variants:
        for ax, key in zip(axes[:2], ("final_all_correct", "final_greedy_all_correct")):
            stats = [rate_interval(own[n][variant][key]) for n in horizons]
            means = [m for m, _ in stats]
            errors = [[m - (i[0] if i else m) for m, i in stats], [(i[1] if i else m) - m for m, i in stats]]
            ax.errorbar(horizons, means, yerr=errors, marker="o", capsize=3, label=VARIANT_LABELS[variant])
        medians = [out["km_median"][str(n)][variant] for n in horizons]
        axes[2].plot(
            horizons, [m if m is not None else budget for m in medians], marker="o", label=VARIANT_LABELS[variant]
        )
        for n, m in zip(horizons, medians):
            if m is None:
                axes[2].scatter([n], [budget], marker="^", facecolors="none", edgecolors="gray")
    axes[2].axhline(budget, color="gray", lw=0.8, ls="--")
    name = "ppm_horizons.png" if env == "multi_add" else f"ppm_horizons_{env}.png"
    save_figure(
        fig,
        axes,
        (
            "final all-correct, T = 1 (own lr)",
            "final all-correct, greedy (own lr)",
            f"samples to {args.target_line}^n (Kaplan–Meier median; ▲ > budget)",
        ),
        "horizon n",
        os.path.join(args.output_dir, name),
    )
