"""`evidence.py`'s PAPO part (PAPO §5.3, §6, §3.2): one process score per comparison, and harder held-out problems.

On `multi_add_boxed`, whose outcome is the box alone, from a warm start whose box states the true sums while 40 % of
its work lines are wrong: correct answers differ in process. Two comparisons, each with one process score r_proc for
every arm (issue 40 item 3):
* **lines**: r_proc = the fraction of the row's points a response states (right lines, then the box);
* **gameable**: r_proc = `shown_work_reward` (well-formed work lines shown, sums unchecked) — the score a policy can
  inflate without being right, the test of PAPO's correct-subset gating.
Arms in each: GRPO (no r_proc), PAPO, PAPO Fullnorm, multiplicative, PRM-only (r_proc alone, no outcome). Every arm
gets its own lr grid (PRM-only ranked by its own reward); the outcome arms are also reported at one shared lr. At the
end every reporting run is evaluated on held-out problems at n + 1 and n + 2 (harder than anything it trained on).
"""

from __future__ import annotations

import os
import statistics
from functools import partial

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
    mean_or_none,
    own_reward_score,
    pinned_warm_start,
    save_figure,
    spec,
    tune,
)
from evidence_stats import gap_triple, paired_gap, rate_interval, shared_lr

from ppm_trl.demo import VARIANT_LABELS

PAPO_ARMS_BY_SCORE = {
    "lines": {"grpo": "sparse", "papo": "papo", "papo_fullnorm": "papo_fullnorm", "papo_mult": "papo_mult",
              "prm_only": "prm_only_lines"},
    "gameable": {"grpo": "sparse", "papo": "papo_gameable", "papo_fullnorm": "papo_fullnorm_gameable",
                 "papo_mult": "papo_mult_gameable", "prm_only": "prm_only"},
}
PAPO_ARMS = PAPO_ARMS_BY_SCORE["lines"]
OWN_REWARD = {"prm_only": "shown_work_reward", "prm_only_lines": "env_point_fraction"}  # the PRM-only arms' reward
OUTCOME_ARMS = ("grpo", "papo", "papo_fullnorm", "papo_mult")  # ranked by accuracy: these share the shared lr
GROUP_ZERO_STD = ("sparse", "prm_only", "prm_only_lines")  # GRPO-shaped arms log TRL's zero-std share


def papo_part(args, summary: dict, tables: list[str]) -> None:
    env, n, steps = "multi_add_boxed", args.papo_n, args.papo_steps
    harder = (n + 1, n + 2)
    path, fingerprint, profile = pinned_warm_start(args, env, [n])
    runner = Runner(args, env, path)
    variants = list(dict.fromkeys(v for arms in PAPO_ARMS_BY_SCORE.values() for v in arms.values()))
    tuned = tune(args, runner, variants, n, steps,
                 scores={v: partial(own_reward_score, reward=reward) for v, reward in OWN_REWARD.items()})
    tables.append(grid_table("PAPO: lr grid (PRM-only arms ranked by their own reward, the others by accuracy)",
                             tuned, n))
    lrs = {score: {"own": {arm: tuned[v]["best"] for arm, v in arms.items()},
                   "shared": dict.fromkeys(arms, shared_lr({arm: tuned[arms[arm]]["grid"] for arm in OUTCOME_ARMS}))}
           for score, arms in PAPO_ARMS_BY_SCORE.items()}
    papo = {"task": env, "n": n, "harder_horizons": list(harder), "warm_start_fingerprint": fingerprint,
            "reporting_seeds": args.seeds, "steps": steps, "process_score_of_arm_keys": "lines",
            "lr_grid": {arm: sorted(tuned[v]["grid"]) for arm, v in PAPO_ARMS.items()},
            "best_lr": {arm: tuned[v]["best"] for arm, v in PAPO_ARMS.items()},
            "best_lr_by_score": {score: lrs[score]["own"] for score in PAPO_ARMS_BY_SCORE},
            "shared_lr": {score: lrs[score]["shared"]["grpo"] for score in PAPO_ARMS_BY_SCORE},
            "tuning_noise": {v: info.get("noise") for v, info in tuned.items()},
            "best_lr_at_edge": any(info["at_edge"] for info in tuned.values()), "profile": profile[n]}
    summary["papo"] = papo
    if args.tune_only or any(lr is None for by in lrs.values() for choice in by.values() for lr in choice.values()):
        return
    wanted = sorted({(PAPO_ARMS_BY_SCORE[score][arm], lr) for score, by in lrs.items() for choice in by.values()
                     for arm, lr in choice.items()})
    runs = runner.run([spec(args, v, n, lr, s, steps, harder=harder) for v, lr in wanted
                       for s in args.seeds])
    if len(runs) < len(wanted) * len(args.seeds):
        return
    report_ = {score: {choice: {arm: arm_report([runs[(v, n, lrs[score][choice][arm], s)] for s in args.seeds], v)
                                for arm, v in arms.items()} for choice in ("own", "shared")}
               for score, arms in PAPO_ARMS_BY_SCORE.items()}
    for score in PAPO_ARMS_BY_SCORE:
        tables.append(papo_table(args, env, n, fingerprint, score, report_[score]))
    own = {score: report_[score]["own"] for score in PAPO_ARMS_BY_SCORE}
    lines, gameable = own["lines"], own["gameable"]
    drop = [start - end for start, end in zip(gameable["prm_only"]["start_accuracy_per_seed"],
                                              gameable["prm_only"]["final_accuracy"])]
    harder_gap = paired_gap(lines["papo"]["harder_accuracy"], lines["grpo"]["harder_accuracy"])
    papo.update(
        # the existing keys, on the "lines" comparison (one process score for every arm)
        zero_adv_frac={arm: lines[arm]["zero_adv_frac"] for arm in PAPO_ARMS},
        final_accuracy={arm: statistics.fmean(lines[arm]["final_accuracy"]) for arm in PAPO_ARMS},
        final_accuracy_ci95={arm: rate_interval(lines[arm]["final_accuracy"])[1] for arm in PAPO_ARMS},
        proc_active_frac={arm: lines[arm]["proc_active_frac"] for arm in PAPO_ARMS},
        prm_only_accuracy_drop=statistics.fmean(drop),  # the gameable PRM-only arm: the reward-hacking one
        # issue 40 item 3
        gameable={arm: outcome_summary(gameable[arm]) for arm in PAPO_ARMS},
        lines={arm: outcome_summary(lines[arm]) for arm in PAPO_ARMS},
        paired_gap_vs_grpo={score: {arm: gap_triple(paired_gap(own[score][arm]["final_accuracy"],
                                                               own[score]["grpo"]["final_accuracy"]))
                                    for arm in PAPO_ARMS if arm != "grpo"} for score in PAPO_ARMS_BY_SCORE},
        matched_lr={score: {arm: statistics.fmean(report_[score]["shared"][arm]["final_accuracy"])
                            for arm in PAPO_ARMS} for score in PAPO_ARMS_BY_SCORE},
        harder_eval={arm: statistics.fmean(lines[arm]["harder_accuracy"]) for arm in PAPO_ARMS},
        harder_eval_by_n={arm: lines[arm]["harder_by_n"] for arm in PAPO_ARMS},
        harder_eval_paired_gap=gap_triple(harder_gap),
        details=report_)
    tables.append(f"PAPO − GRPO on the harder held-out problems (n = {harder[0]}, {harder[1]}; accuracy averaged over "
                  f"both, paired by seed): {fmt_gap(harder_gap)}")
    plot_papo(args, own)


def arm_report(results: list[dict], variant: str) -> dict:
    """One arm over the reporting seeds: final numbers, per-step curves, and the harder held-out accuracy."""
    zero_metric = "frac_reward_zero_std" if variant in GROUP_ZERO_STD else "papo/zero_advantage_fraction"
    harder = sorted(results[0]["history"][-1].get("harder", {}), key=int)
    return {
        "variant": variant, "lr": results[0]["spec"]["learning_rate"],
        "zero_adv_frac": mean_or_none(logged_mean(r, zero_metric) for r in results),
        "proc_active_frac": mean_or_none(logged_mean(r, "papo/proc_active_fraction") for r in results),
        "final_accuracy": [final(r) for r in results],
        "final_greedy_accuracy": [final(r, "greedy_all_correct") for r in results],
        "final_line_accuracy": [final(r, "per_subproblem") for r in results],
        "final_shown_work": [final(r, "shown_work") for r in results],
        "start_accuracy_per_seed": [r["history"][0]["all_correct"] for r in results],
        "start_accuracy": results[0]["history"][0]["all_correct"],
        "start_line_accuracy": results[0]["history"][0]["per_subproblem"],
        "start_shown_work": results[0]["history"][0]["shown_work"],
        "length_first_window": mean_or_none(logged_series(r, "completions/mean_length")[0][1] for r in results),
        "length_last_window": mean_or_none(logged_series(r, "completions/mean_length")[-1][1] for r in results),
        "clipped_last_window": mean_or_none(logged_series(r, "completions/clipped_ratio")[-1][1] for r in results),
        "harder_by_n": {m: statistics.fmean(r["history"][-1]["harder"][m]["all_correct"] for r in results)
                        for m in harder},
        "harder_accuracy": [statistics.fmean(r["history"][-1]["harder"][m]["all_correct"] for m in harder)
                            for r in results],
        "curves": [{"history": [{k: h[k] for k in ("step", "all_correct", "per_subproblem", "shown_work")}
                                for h in r["history"]],
                    **{name: logged_series(r, metric) for name, metric in (
                        ("zero_adv", zero_metric), ("proc_active", "papo/proc_active_fraction"),
                        ("length", "completions/mean_length"), ("clipped", "completions/clipped_ratio"))}}
                   for r in results]}


def outcome_summary(arm: dict) -> dict:
    """papo.gameable / papo.lines: final accuracy and line accuracy, and how far the gameable score moved on the
    held-out prompts (step 0 → end) — whether the arm inflated it."""
    return {"final_accuracy": statistics.fmean(arm["final_accuracy"]),
            "line_accuracy": statistics.fmean(arm["final_line_accuracy"]),
            "prm_reward_delta": statistics.fmean(arm["final_shown_work"]) - arm["start_shown_work"]}


def papo_table(args, env: str, n: int, fingerprint: str, score: str, report_: dict) -> str:
    rows = []
    for arm, a in report_["own"].items():
        shared = report_["shared"][arm]
        rows.append([VARIANT_LABELS[a["variant"]], f"{a['lr']:g}", fmt(a["zero_adv_frac"]), fmt(a["proc_active_frac"]),
                     f"{a['start_accuracy']:.3f}", fmt_interval(a["final_accuracy"]),
                     fmt_interval(a["final_greedy_accuracy"]),
                     f"{a['start_line_accuracy']:.3f} → " + fmt_interval(a["final_line_accuracy"]),
                     f"{a['start_shown_work']:.3f} → " + fmt_interval(a["final_shown_work"]),
                     f"{fmt(a['length_first_window'], 1)} → {fmt(a['length_last_window'], 1)}",
                     fmt(a["clipped_last_window"]),
                     " / ".join(f"{v:.3f}" for v in a["harder_by_n"].values()),
                     f"{shared['lr']:g}: " + fmt_interval(shared["final_accuracy"])])
    name = {"lines": "the fraction of right lines", "gameable": "the gameable `shown_work_reward`"}[score]
    return (f"### PAPO on {env}, r_proc = {name} (n = {n}, warm start {fingerprint}; {len(args.seeds)} reporting "
            f"seeds; each arm at its own best lr; mean [t 95 % interval, clipped to [0, 1]])\n\n" + markdown_table(
                ["arm", "lr", "rows with zero advantage (mean over training)", "groups with A_proc active",
                 "step-0 accuracy", "final accuracy T=1", "final accuracy greedy", "line accuracy",
                 "gameable score (held-out)", "completion length (first → last window)", "clipped ratio, last window",
                 f"accuracy at n = {n + 1} / {n + 2}", "at the shared lr: final accuracy T=1"], rows))


def plot_papo(args, own: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = (("accuracy (T = 1)", lambda c: [(h["step"], h["all_correct"]) for h in c["history"]]),
             ("line accuracy", lambda c: [(h["step"], h["per_subproblem"]) for h in c["history"]]),
             ("gameable score (held-out)", lambda c: [(h["step"], h["shown_work"]) for h in c["history"]]),
             ("rows with zero advantage", lambda c: c["zero_adv"]), ("completion length", lambda c: c["length"]))
    fig, grid = plt.subplots(len(own), len(picks), figsize=(21, 3.8 * len(own)), squeeze=False)
    for axes, (score, report_) in zip(grid, own.items()):
        for arm, data in report_.items():
            for ax, (_, pick) in zip(axes, picks):
                series = [pick(c) for c in data["curves"]]
                steps = [s for s, _ in series[0]]
                ax.plot(steps, [statistics.fmean(v[i][1] for v in series) for i in range(len(steps))], marker="o",
                        label=arm)
        save_figure(fig, axes, [f"{title} — r_proc: {score}" for title, _ in picks], "step", None)
    fig.tight_layout()
    fig.savefig(os.path.join(args.output_dir, "papo.png"), dpi=110)
    plt.close(fig)
