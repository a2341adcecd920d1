"""`evidence.py`'s ARG part (ARG §5, App. G.2) on `multi_add_any_order`: ARG against the paper's baselines.

* **main regime**: the smallest n whose base all-correct is in (0, 0.1]. Arms: ARG, the paper's resampling
  (`arg_mode="resampling"`: K continuations from the empty prefix, an unrescued group left unchanged), resampling +
  reference fallback (one level α = 1), fixed α = ½, fixed α = ¼, reference insertion, GRPO.
* **hard regime**: the next horizon, where GRPO's groups fail entirely most of the time (the regime the paper says ARG
  is for; its share is measured from GRPO's own logs): GRPO, ARG, the paper's resampling.
Every arm gets its own lr grid on the tuning seeds; reported on `--arg-seeds` (≥ 5: GRPO is bimodal) with pass@1 /
pass@8 / avg@8 at the end, paired by seed against GRPO; per step the logged diagnostics (share of the batch replaced,
entropy, clipped tokens, gradient norm, length).
"""

from __future__ import annotations

import os
import statistics

from common import markdown_table
from evidence_protocol import (
    Runner,
    final,
    fmt,
    fmt_gap,
    fmt_interval,
    grid_table,
    logged_mean,
    logged_series,
    logged_sum,
    mean_or_none,
    pinned_warm_start,
    samples_per_step,
    spec,
    tune,
)
from evidence_stats import gap_triple, paired_gap, rate_interval

from ppm_trl.demo import VARIANT_LABELS

ARG_ARMS = {"arg": "arg", "resampling": "paper_resampling", "resampling_fallback": "resampling",
            "fixed_half": "fixed_prefix", "fixed_quarter": "fixed_quarter",
            "reference_insertion": "reference_insertion", "grpo": "sparse"}
HARD_ARMS = {"arg": "arg", "resampling": "paper_resampling", "grpo": "sparse"}
# Per-step diagnostics read from the training logs (TRL's and ARG's), as (column, metric).
DIAGNOSTICS = (("batch share replaced", "arg/inserted_rows"), ("entropy", "entropy"),
               ("clipped tokens", "clip_ratio/region_mean"), ("grad norm", "grad_norm"),
               ("length", "completions/mean_length"), ("zero-std groups", "frac_reward_zero_std"),
               # the inserted rows' tokens the policy did not sample (prefix, fallback reference) and their log-probs
               ("inserted: unsampled token share", "arg/inserted_unsampled_token_share"),
               ("inserted: log π unsampled", "arg/inserted_unsampled_logp"),
               ("inserted: log π sampled", "arg/inserted_sampled_logp"))
# The cause found (issue 40 item 4), read from the main regime's reporting runs (the arms' paired gaps, their
# diagnostics); its numbers are filled in from the runs the summary is made of.
DIAGNOSIS = (
    "the reference rows: at n = 3 every arm that puts reference tokens into a group (a fallback reference, a "
    "reference prefix) ends below GRPO in pass@8, the paper's resampling (no fallback: an unrescued group is left "
    "unchanged, App. G.2) ends above it, and the same resampling with the reference fallback loses {fallback_cost:.3f} "
    "pass@8 (paired). A reference row turns a group without reward spread (GRPO: {grpo_zero_spread:.2f} of its groups) "
    "into one with a large positive advantage on tokens the policy mostly did not sample and a negative one on each "
    "of its own K - 1 attempts (eq. 28); the paper's Table 2a has reference insertion below GRPO too. Not a departure "
    "from the paper; these arms do not separate the two halves of that row."
)


def arg_part(args, summary: dict, tables: list[str]) -> None:
    env, steps = "multi_add_any_order", args.arg_steps
    horizons = [1, 2] if args.quick else [2, 3, 4]
    path, fingerprint, profile = pinned_warm_start(args, env, horizons)
    # Where ARG acts: the smallest n whose base all-correct is in (0, 0.1] — most groups fail entirely, yet the task
    # is solvable; the hard regime is the next horizon.
    solvable = [n for n in horizons[:-1] if 0 < profile[n]["all_correct"] <= 0.1] or ([1] if args.quick else [])
    if not solvable:
        raise SystemExit(f"{env}: no horizon below {horizons[-1]} with base all-correct in (0, 0.1]; nothing to "
                         "measure")
    n, runner = solvable[0], Runner(args, env, path)
    hard_n = n + 1
    arg = {"task": env, "n": n, "hard_n": hard_n, "warm_start_fingerprint": fingerprint,
           "reporting_seeds": args.arg_seeds, "steps": steps, "profile": profile[n], "hard_profile": profile[hard_n],
           "diagnosis": None, "grpo_all_failure_share": {}}
    summary["arg"] = arg
    # The hard regime first: its targets are the part's (issue 40); the main regime's seven arms diagnose. Order
    # changes no number (every run is its own cached spec).
    hard_tables = []
    hard = regime(args, runner, env, hard_n, steps, HARD_ARMS, hard_tables, f"ARG, hard regime, on {env}",
                  profile[hard_n], fingerprint)
    main = regime(args, runner, env, n, steps, ARG_ARMS, tables, f"ARG on {env}", profile[n], fingerprint)
    tables.extend(hard_tables)
    arg.update(lr={arm: lr for arm, lr in main["lrs"].items()}, lr_grid=main["grids"],
               best_lr_at_edge=main["at_edge"], hard_lr=hard["lrs"], hard_lr_grid=hard["grids"])
    if "report" in hard:
        hard_report = hard["report"]
        gap = paired_gap(hard_report["arg"]["pass@8"], hard_report["grpo"]["pass@8"])
        arg.update(hard_regime={arm: statistics.fmean(hard_report[arm]["pass@8"]) for arm in HARD_ARMS},
                   hard_rescue_rate={arm: hard_report[arm]["rescue_rate"] for arm in HARD_ARMS if arm != "grpo"},
                   vs_grpo_paired=gap_triple(gap), hard_details=hard_report)
        arg["grpo_all_failure_share"]["hard"] = hard_report["grpo"]["zero_std_share"]
        tables.append(f"ARG − GRPO pass@8 at n = {hard_n}, paired by seed: {fmt_gap(gap)}; GRPO's groups with zero "
                      f"reward spread over training (all-failure or all-success): "
                      f"{fmt(hard_report['grpo']['zero_std_share'])}")
    if "report" not in main:
        return
    report_ = main["report"]
    # the diagnosis's contrast: the same resampling arm without and with the reference fallback
    fallback_gap = paired_gap(report_["resampling"]["pass@8"], report_["resampling_fallback"]["pass@8"])
    arg.update(rescue_rate={arm: report_[arm]["rescue_rate"] for arm in ARG_ARMS if arm != "grpo"},
               pass_at_8={arm: statistics.fmean(report_[arm]["pass@8"]) for arm in ARG_ARMS},
               pass_at_8_ci95={arm: rate_interval(report_[arm]["pass@8"])[1] for arm in ARG_ARMS},
               pass_at_1={arm: statistics.fmean(report_[arm]["pass@1"]) for arm in ARG_ARMS},
               paired_vs_grpo={arm: {key: gap_triple(paired_gap(report_[arm][key], report_["grpo"][key]))
                                     for key in ("pass@1", "pass@8")} for arm in ARG_ARMS if arm != "grpo"},
               paper_resampling={"rescue_rate": report_["resampling"]["rescue_rate"],
                                 "pass_at_8": statistics.fmean(report_["resampling"]["pass@8"])},
               fallback_cost_paired=gap_triple(fallback_gap),
               details=report_)
    arg["grpo_all_failure_share"]["main"] = report_["grpo"]["zero_std_share"]
    arg["diagnosis"] = DIAGNOSIS.format(fallback_cost=fallback_gap["mean"],
                                        grpo_zero_spread=report_["grpo"]["zero_std_share"])
    tables.append(f"The paper's resampling − resampling + reference fallback, pass@8 at n = {n}, paired by seed: "
                  f"{fmt_gap(fallback_gap)}")
    plot_arg(args, report_["arg"])


def regime(args, runner: Runner, env: str, n: int, steps: int, arms: dict, tables: list, title: str, profile: dict,
           fingerprint: str) -> dict:
    """Tune every arm at n, train the reporting seeds at each arm's best lr, summarise; {"lrs", "grids", "at_edge"}
    and, once every run is in, "report" (arm → numbers)."""
    tuned = tune(args, runner, list(arms.values()), n, steps)
    tables.append(grid_table(f"{title}: lr grids", tuned, n))
    out = {"lrs": {arm: tuned[v]["best"] for arm, v in arms.items()},
           "grids": {arm: sorted(tuned[v]["grid"]) for arm, v in arms.items()},
           "at_edge": any(info["at_edge"] for info in tuned.values())}
    if args.tune_only or any(lr is None for lr in out["lrs"].values()):
        return out
    specs = [spec(args, v, n, out["lrs"][arm], s, steps, pass_k=8) for arm, v in arms.items()
             for s in args.arg_seeds]
    runs = runner.run(specs)
    if len(runs) < len(specs):
        return out
    report_ = {arm: arm_report([runs[(v, n, out["lrs"][arm], s)] for s in args.arg_seeds], v,
                               samples_per_step(args)) for arm, v in arms.items()}
    tables.append(outcome_table(args, env, n, title, profile, fingerprint, report_))
    tables.append(diagnostics_table(n, title, report_))
    out["report"] = report_
    return out


def arm_report(results: list[dict], variant: str, rows_per_step: int) -> dict:
    failed = [logged_sum(r, "arg/all_failure_groups") for r in results]
    rescued = [logged_sum(r, "arg/groups_with_accepted") for r in results]
    levels = sorted({name.rsplit("/", 1)[1] for r in results for log in r.get("train_logs", []) for name in log
                     if name.startswith("arg/correct_rate/")})
    per_level = {level: {what: mean_or_none(logged_mean(r, f"arg/{what}_rate/{level}") for r in results)
                         for what in ("correct", "copy", "success", "acceptance")} for level in levels}
    diagnostics = {}
    for column, metric in DIAGNOSTICS:
        first_last = [(s[0][1], s[-1][1]) for s in (logged_series(r, metric) for r in results) if s]
        if first_last:
            scale = rows_per_step if metric == "arg/inserted_rows" else 1  # inserted rows → share of the batch
            diagnostics[column] = [statistics.fmean(f for f, _ in first_last) / scale,
                                   statistics.fmean(last for _, last in first_last) / scale]
    return {
        "variant": variant, "lr": results[0]["spec"]["learning_rate"],
        "rescue_rate": sum(rescued) / sum(failed) if sum(failed) else None,
        "rescue_rate_per_seed": [r / f if f else None for r, f in zip(rescued, failed)],
        "all_failure_groups": sum(failed), "groups_with_accepted": sum(rescued), "per_level": per_level,
        "zero_std_share": mean_or_none(logged_mean(r, "frac_reward_zero_std") for r in results),
        **{key: [final(r, key) for r in results] for key in ("pass@1", "pass@8", "avg@8", "all_correct",
                                                               "greedy_all_correct")},
        "diagnostics_first_last_window": diagnostics,
        # KL(π ‖ π_start) per token on the held-out samples of the last evaluation (None: a run from before it)
        "kl_to_start": [r["history"][-1].get("kl_to_start") for r in results],
        "curves": [{name: logged_series(r, metric) for name, metric in DIAGNOSTICS} for r in results],
        "selector_prob": {level: [logged_series(r, f"arg/selector_prob/{level}") for r in results]
                          for level in levels}}


def outcome_table(args, env: str, n: int, title: str, profile: dict, fingerprint: str, report_: dict) -> str:
    rows = []
    for arm, a in report_.items():
        guided = a["variant"] != "sparse"  # GRPO guides nothing: no all-failure counts to show
        gap = None if arm == "grpo" else paired_gap(a["pass@8"], report_["grpo"]["pass@8"])
        rows.append([VARIANT_LABELS[a["variant"]], f"{a['lr']:g}", f"{a['all_failure_groups']:.0f}" if guided else "–",
                     f"{a['groups_with_accepted']:.0f}" if guided else "–", fmt(a["rescue_rate"]),
                     fmt_interval(a["pass@1"]), fmt_interval(a["pass@8"]), fmt_interval(a["avg@8"]),
                     fmt_interval(a["greedy_all_correct"]), "–" if gap is None else fmt_gap(gap),
                     "; ".join(f"{lv}: correct {fmt(m['correct'])} copy {fmt(m['copy'])} accepted "
                               f"{fmt(m['acceptance'])}" for lv, m in a["per_level"].items()) or "–"])
    return (f"### {title} (n = {n}, base all-correct {profile['all_correct']:.3f}; each arm at its own best lr; "
            f"{len(args.arg_seeds)} reporting seeds; warm start {fingerprint}; mean [t 95 % interval, clipped to "
            "[0, 1]])\n\n" + markdown_table(
                ["arm", "lr", "all-failure groups", "rescued", "rescue rate", "pass@1", "pass@8", "avg@8", "greedy",
                 "pass@8 − GRPO (paired)", "continuations per α"], rows))


def diagnostics_table(n: int, title: str, report_: dict) -> str:
    columns = [column for column, _ in DIAGNOSTICS]
    rows = [[VARIANT_LABELS[a["variant"]]] + [
        "–" if column not in a["diagnostics_first_last_window"] else
        "{:.3f} → {:.3f}".format(*a["diagnostics_first_last_window"][column]) for column in columns]
        + [_mean_text([kl for kl in a.get("kl_to_start", []) if kl is not None])] for a in report_.values()]
    return (f"### {title}: training diagnostics, first → last logging window (mean over seeds; n = {n})\n\n"
            + markdown_table(["arm", *columns, "KL to start, last evaluation"], rows))


def _mean_text(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4f}" if values else "–"


def plot_arg(args, arg_report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for level, per_seed in arg_report["selector_prob"].items():
        for i, series in enumerate(per_seed):
            if series:
                ax.plot([s for s, _ in series], [p for _, p in series],
                        color=f"C{list(arg_report['selector_prob']).index(level)}", alpha=0.8,
                        label=level if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("selector probability")
    ax.set_title("ARG's selector over training (one line per seed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.output_dir, "arg_selector.png"), dpi=110)
    plt.close(fig)
