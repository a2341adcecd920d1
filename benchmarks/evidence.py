"""Each paper's own headline metric, on a task where its mechanism can act, from one pinned warm start per task.

    python benchmarks/evidence.py --workers 2                  # everything (~1.5 h on 2 cores); resumes if stopped
    python benchmarks/evidence.py --parts ppm --workers 2      # one part
    python benchmarks/evidence.py --summarize-only             # tables and summary.json from the cached runs
    python benchmarks/evidence.py --quick                      # CI smoke (tiny warm start, 2 steps)

Parts (every run: `ppm_trl.demo.train_variant`, one thread, deterministic; cached as JSON under `--output-dir/runs`):

* **ppm** (PPM §5, Fig. 4; App. B's trainable fraction) on `multi_add` at the warm start's *cliff* and *easy*
  horizons (`ppm_trl.demo.horizons`, the rule printed with the profile): GRPO (sparse), PPM trajectory-level, PPM
  segment-level with equal chunks and with one segment per line (the easy horizon: GRPO, trajectory, lines). Each
  variant's lr is its best of `--lrs` at the cliff (seed 0, final all-correct, ties → per-sub-problem), then
  `--seeds` at that lr at both horizons. Reported:
  samples to `--target` all-correct per seed (a seed that never reaches it counts as one evaluation past the budget,
  a lower bound), the ratio of medians GRPO / segment with a 95 % bootstrap interval over seeds, and the fraction of
  groups with a non-zero advantage (PPM App. B: 95 % for PPM vs 0.2 % for sparse at their horizon).
* **papo** (PAPO §5.3, §6) at the easy horizon, where groups become all-correct: GRPO vs PAPO (decoupled) vs PAPO
  multiplicative, each at its best lr of the grid (seed 0), `--papo-seeds` seeds: the fraction of rows with a zero
  advantage over training (GRPO: rows of groups with equal rewards; PAPO: |A| = 0) and the final accuracy (the
  multiplicative combination is the paper's reward-hacking ablation).
* **arg** (ARG App. G.2) on `multi_add_any_order`, whose lines may come in any order (its own warm start learned
  varied orders), at the smallest n whose base all-correct is in (0, 0.1] (most groups fail entirely): ARG vs a fixed prefix (α = ½) vs reference insertion, `--arg-seeds`
  seeds at GRPO's lr: the rescue rate (all-failure groups that accept a candidate trajectory, reference fallback
  excluded) and per α the raw correct, byte-copy and accepted rates of the continuations.

All headline numbers go to `--output-dir/summary.json` (with the warm-start fingerprints), tables to `tables.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import asdict

from common import RESULTS, markdown_table, samples_to_target

from ppm_trl.demo import VARIANT_LABELS, RunSpec, choose_horizons, format_profile, profile_warm_start, train_variant
from ppm_trl.demo.warmstart import WarmStartSettings, read_manifest, warm_start
from ppm_trl.envs import make_dataset

PPM_VARIANTS = ["sparse", "trajectory", "segment", "lines"]
EASY_VARIANTS = ["sparse", "trajectory", "lines"]  # the paper's three (segment = one segment per line)
PAPO_VARIANTS = ["sparse", "papo", "papo_mult"]
ARG_VARIANTS = ["arg", "fixed_prefix", "reference_insertion"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=["ppm", "papo", "arg"], default=["ppm", "papo", "arg"])
    parser.add_argument("--horizons", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    parser.add_argument("--profile-size", type=int, default=256)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--papo-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arg-seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=60, help="RL steps per run (64 samples each).")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=128)
    parser.add_argument("--target", type=float, default=0.1, help="All-correct target at the cliff.")
    parser.add_argument("--easy-target", type=float, default=0.45, help="All-correct target at the easy horizon.")
    parser.add_argument("--bootstrap", type=int, default=10_000, help="Bootstrap resamples of the seeds.")
    parser.add_argument("--workers", type=int, default=1, help="Runs in parallel (processes, one thread each).")
    parser.add_argument("--output-dir", default=os.path.join(RESULTS, "evidence"))
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache root.")
    parser.add_argument("--tune-seeds", type=int, default=None,
                        help="Seeds per (variant, lr) in the tuning grid; the best lr has the best mean final "
                        "all-correct over them (default: all --seeds: one lucky seed cannot pick the lr).")
    parser.add_argument("--tune-only", action="store_true", help="Stop after the PPM tuning grid (a second process "
                        "can fill the grid while the first runs the other parts).")
    parser.add_argument("--summarize-only", action="store_true", help="Train nothing; summarise the cached runs.")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny warm starts, 2 steps, 1 seed.")
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------------------------ runs
def run_path(args, env: str, spec: RunSpec) -> str:
    return os.path.join(args.output_dir, "runs", f"{env}_{spec.variant}_n{spec.n}_lr{spec.learning_rate:g}"
                        f"_s{spec.seed}.json")


def _run_job(model_path: str, env: str, spec: RunSpec, eval_size: int, path: str) -> dict:
    eval_dataset = make_dataset(env, spec.n, eval_size, seed=90_000 + spec.n)
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        result = train_variant(model_path, spec, eval_dataset, scratch, progress=False)
    result["wall_seconds"] = time.time() - started
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(path + ".tmp", path)
    return result


def run_all(args, model_path: str, env: str, specs: list[RunSpec]) -> dict[tuple, dict]:
    """{(variant, n, lr, seed): result} for `specs`, training the uncached ones `--workers` at a time."""
    results, todo = {}, []
    for spec in specs:
        key, path = (spec.variant, spec.n, spec.learning_rate, spec.seed), run_path(args, env, spec)
        if os.path.exists(path):
            with open(path) as handle:
                results[key] = json.load(handle)
        elif not args.summarize_only:
            todo.append((key, spec, path))
    if not todo:
        return results
    print(f"  {env}: {len(todo)} run(s) to train, {args.workers} at a time", flush=True)

    def report(key, result):
        first, last = result["history"][0], result["history"][-1]
        print(f"    {key[0]:>20} n={key[1]} lr={key[2]:g} seed={key[3]}: all-correct {first['all_correct']:.3f} → "
              f"{last['all_correct']:.3f}, per-sub {first['per_subproblem']:.3f} → {last['per_subproblem']:.3f} "
              f"({result['wall_seconds']:.0f}s)", flush=True)

    if args.workers == 1:
        for key, spec, path in todo:
            results[key] = _run_job(model_path, env, spec, args.eval_size, path)
            report(key, results[key])
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_run_job, model_path, env, spec, args.eval_size, path): key for key, spec, path in todo}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            report(futures[future], results[futures[future]])
    return results


def spec(args, variant: str, n: int, lr: float, seed: int) -> RunSpec:
    return RunSpec(variant=variant, n=n, learning_rate=lr, max_steps=args.steps, eval_every=args.eval_every, seed=seed)


def tune(args, model_path, env, variants, n, seeds=None) -> tuple[dict[str, float], dict]:
    """Each variant's best lr of the grid at horizon n: the best mean final all-correct over `seeds` (ties → mean
    per-sub-problem accuracy)."""
    seeds = seeds or args.seeds[: args.tune_seeds or len(args.seeds)]
    grid = run_all(args, model_path, env, [spec(args, v, n, lr, s) for v in variants for lr in args.lrs
                                            for s in seeds])
    best = {}
    for variant in variants:
        scores = {}
        for lr in args.lrs:
            runs = [grid[(variant, n, lr, s)] for s in seeds if (variant, n, lr, s) in grid]
            if runs:
                scores[lr] = (statistics.fmean(final(r, "all_correct") for r in runs),
                              statistics.fmean(final(r, "per_subproblem") for r in runs))
        if scores:
            best[variant] = max(scores, key=scores.__getitem__)
    return best, grid


# ---------------------------------------------------------------------------------------------------- metrics
def final(result: dict, key: str) -> float:
    return result["history"][-1][key]


def logged_mean(result: dict, name: str) -> float | None:
    """Mean over the logging windows of a training metric (TRL averages each window over its steps)."""
    values = [log[name] for log in result.get("train_logs", []) if name in log]
    return statistics.fmean(values) if values else None


def last_logged(result: dict, name: str) -> float | None:
    values = [log[name] for log in result.get("train_logs", []) if name in log]
    return values[-1] if values else None


def mean_of_present(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def logged_sum(result: dict, name: str) -> float:
    """Σ over steps of a per-step count metric (window mean × window length)."""
    total, previous = 0.0, 0
    for log in result.get("train_logs", []):
        if name in log:
            total += log[name] * (log["step"] - previous)
        previous = log["step"]
    return total


def trainable_fraction(result: dict) -> float | None:
    """Fraction of groups with a non-zero advantage: PPM logs it; for an outcome-only variant it is the groups whose
    rewards differ."""
    value = logged_mean(result, "ppm/frac_groups_nonzero_advantage")
    if value is None:
        zero = logged_mean(result, "frac_reward_zero_std")
        value = None if zero is None else 1.0 - zero
    return value


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def budget_samples(args, spec_: RunSpec) -> int:
    return spec_.max_steps * spec_.samples_per_step


def samples_or_censored(result: dict, target: float, censor: int) -> tuple[int, bool]:
    reached = samples_to_target(result["history"], target)
    return (reached, True) if reached is not None else (censor, False)


def bootstrap_gap(a: list[float], b: list[float], resamples: int, seed: int = 0) -> tuple[float, list[float]]:
    """mean(a) − mean(b) and its 95 % percentile bootstrap interval (seeds resampled per arm)."""
    rng = random.Random(seed)
    point = statistics.fmean(a) - statistics.fmean(b)
    gaps = sorted(statistics.fmean(rng.choice(a) for _ in a) - statistics.fmean(rng.choice(b) for _ in b)
                  for _ in range(resamples))
    return point, [gaps[int(0.025 * (resamples - 1))], gaps[int(0.975 * (resamples - 1))]]


def bootstrap_ratio(numerator: list[float], denominator: list[float], resamples: int, seed: int = 0
                    ) -> tuple[float, list[float]]:
    """median(numerator)/median(denominator) and its 95 % percentile bootstrap interval (seeds resampled per arm)."""
    rng = random.Random(seed)
    point = statistics.median(numerator) / statistics.median(denominator)
    ratios = []
    for _ in range(resamples):
        num = [rng.choice(numerator) for _ in numerator]
        den = [rng.choice(denominator) for _ in denominator]
        ratios.append(statistics.median(num) / statistics.median(den))
    ratios.sort()
    return point, [ratios[int(0.025 * (resamples - 1))], ratios[int(0.975 * (resamples - 1))]]


# ---------------------------------------------------------------------------------------------------- warm starts
def pinned_warm_start(args, env: str) -> tuple[str, str, dict, dict, dict]:
    """(path, fingerprint, profile, {"cliff", "easy"}, reasons) of `env`'s recipe warm start."""
    settings = WarmStartSettings.for_env(env)
    if args.quick:
        settings = WarmStartSettings(env=env, horizons=(1, 2), num_examples=64, max_steps=2, batch_size=8,
                                     hidden_size=32, num_hidden_layers=1)
    path = warm_start(settings, cache_root=args.cache_dir, progress=False)
    fingerprint = read_manifest(path)["weights_digest"]
    profile_file = os.path.join(args.output_dir, f"profile_{env}.json")
    if os.path.exists(profile_file):
        with open(profile_file) as handle:
            stored = json.load(handle)
        if stored["fingerprint"] != fingerprint:
            raise SystemExit(f"{args.output_dir} holds runs of warm start {stored['fingerprint']} for {env}; this "
                             f"machine built {fingerprint}. Use another --output-dir (or delete the old runs).")
        profile = {int(n): v for n, v in stored["profile"].items()}
    else:
        horizons = [1, 2] if args.quick else args.horizons
        profile = profile_warm_start(path, env, horizons, 8 if args.quick else args.profile_size)
        os.makedirs(args.output_dir, exist_ok=True)
        with open(profile_file, "w") as handle:
            json.dump({"fingerprint": fingerprint, "settings": asdict(settings), "profile": profile}, handle, indent=2)
    chosen, reasons = choose_horizons(profile)
    if args.quick:
        chosen = {"cliff": 2, "easy": 1}
    print(f"{env}: warm start {fingerprint} ({path})\n{format_profile(profile, reasons)}\n  → {chosen}", flush=True)
    return path, fingerprint, profile, chosen, reasons


def require(chosen: dict, *names: str) -> None:
    missing = [name for name in names if chosen.get(name) is None]
    if missing:
        raise SystemExit(f"the warm start has no {' and no '.join(missing)} horizon by the rule (see the profile "
                         "above); nothing to measure")


# ---------------------------------------------------------------------------------------------------------- parts
def ppm_part(args, summary: dict, tables: list[str]) -> None:
    path, fingerprint, profile, chosen, _ = pinned_warm_start(args, "multi_add")
    require(chosen, "cliff", "easy")
    summary["warm_start_fingerprint"] = fingerprint
    cliff, easy = chosen["cliff"], chosen["easy"]
    best, grid = tune(args, path, "multi_add", PPM_VARIANTS, cliff)
    if args.tune_only:
        return
    rows = []
    for variant in PPM_VARIANTS:
        for lr in args.lrs:
            runs = [r for (v, _, rate, _), r in sorted(grid.items()) if v == variant and rate == lr]
            if runs:
                ac = [final(r, "all_correct") for r in runs]
                rows.append([VARIANT_LABELS[variant], f"{lr:g}", " ".join(f"{a:.3f}" for a in ac),
                             f"{statistics.fmean(ac):.3f}",
                             f"{statistics.fmean(final(r, 'per_subproblem') for r in runs):.3f}",
                             "best" if best.get(variant) == lr else ""])
    tables.append(f"### PPM: lr grid at the cliff (n = {cliff}; final all-correct per seed)\n\n"
                  + markdown_table(["variant", "lr", "final all-correct per seed", "mean", "mean per-sub-problem",
                                    ""], rows))
    report = {"cliff_n": cliff, "easy_n": easy, "best_lr": best, "tune_seeds": len(args.seeds[: args.tune_seeds or
                                                                                            len(args.seeds)]), "targets": {"cliff": args.target,
                                                                              "easy": args.easy_target}}
    for label, n, target, variants in (("cliff", cliff, args.target, PPM_VARIANTS),
                                       ("easy", easy, args.easy_target, EASY_VARIANTS)):
        runs = run_all(args, path, "multi_add", [spec(args, v, n, best[v], s) for v in variants if v in best
                                                  for s in args.seeds])
        per_variant, rows = {}, []
        for variant in [v for v in variants if v in best]:
            results = [runs[k] for k in sorted(runs) if k[0] == variant]
            if not results:
                continue
            censor = budget_samples(args, spec(args, variant, n, best[variant], 0)) + args.eval_every * 64
            samples = [samples_or_censored(r, target, censor) for r in results]
            trainable = [t for t in (trainable_fraction(r) for r in results) if t is not None]
            per_variant[variant] = {
                "samples_to_target": [s for s, _ in samples], "reached": [ok for _, ok in samples],
                "final_all_correct": [final(r, "all_correct") for r in results],
                "final_per_subproblem": [final(r, "per_subproblem") for r in results],
                "trainable_fraction": statistics.fmean(trainable) if trainable else None,
                "start_all_correct": results[0]["history"][0]["all_correct"], "lr": best[variant]}
            ac = per_variant[variant]["final_all_correct"]
            rows.append([VARIANT_LABELS[variant], f"{best[variant]:g}",
                         f"{results[0]['history'][0]['all_correct']:.3f}",
                         f"{statistics.fmean(ac):.3f} ({min(ac):.3f}-{max(ac):.3f})",
                         f"{statistics.fmean(per_variant[variant]['final_per_subproblem']):.3f}",
                         " ".join(f"{s}" if ok else f">{s - args.eval_every * 64}" for s, ok in samples),
                         f"{statistics.median(s for s, _ in samples):.0f}",
                         f"{per_variant[variant]['trainable_fraction']:.3f}" if trainable else "–"])
        report[label] = per_variant
        tables.append(f"### PPM at the {label} horizon (n = {n}, base all-correct {profile[n]['all_correct']:.3f}; "
                      f"target {target:g} all-correct; {len(args.seeds)} seeds)\n\n" + markdown_table(
                          ["variant", "lr", "step-0 all-correct", "final all-correct mean (range)",
                           "final per-sub-problem", "samples to target per seed", "median",
                           "groups with a non-zero advantage"], rows))
    cliff_runs = report["cliff"]
    for name in ("lines", "segment"):
        if name in cliff_runs and "sparse" in cliff_runs:
            ratio, interval = bootstrap_ratio(cliff_runs["sparse"]["samples_to_target"],
                                              cliff_runs[name]["samples_to_target"], args.bootstrap)
            report[f"ratio_{name}"] = {"median": ratio, "ci95": interval,
                                       "grpo_censored": sum(not ok for ok in cliff_runs["sparse"]["reached"]),
                                       f"{name}_censored": sum(not ok for ok in cliff_runs[name]["reached"])}
            for key in ("final_all_correct", "final_per_subproblem"):
                gap, gap_interval = bootstrap_gap(cliff_runs[name][key], cliff_runs["sparse"][key], args.bootstrap)
                report[f"gap_{name}_{key}"] = {"mean": gap, "ci95": gap_interval}
    headline = "lines" if "ratio_lines" in report else "segment"
    summary["ppm"] = {"cliff_n": cliff, "easy_n": easy, "segmentation": headline,
                      "samples_to_target": {"segment": cliff_runs.get(headline, {}).get("samples_to_target"),
                                            "grpo": cliff_runs.get("sparse", {}).get("samples_to_target")},
                      "ratio_median": report.get(f"ratio_{headline}", {}).get("median"),
                      "ratio_ci95": report.get(f"ratio_{headline}", {}).get("ci95"),
                      "final_all_correct_gap": report.get(f"gap_{headline}_final_all_correct"),
                      "final_per_subproblem_gap": report.get(f"gap_{headline}_final_per_subproblem"),
                      "details": report}
    for name in ("lines", "segment"):
        if f"ratio_{name}" in report:
            ratio, gap = report[f"ratio_{name}"], report[f"gap_{name}_final_all_correct"]
            tables.append(f"PPM ({name}) vs GRPO at the cliff: samples to {args.target:g} (ratio of medians GRPO / "
                          f"PPM) {ratio['median']:.2f} [{ratio['ci95'][0]:.2f}, {ratio['ci95'][1]:.2f}] — a lower bound "
                          f"while GRPO seeds never reach it ({ratio['grpo_censored']} of {len(args.seeds)} censored at "
                          f"one evaluation past the budget); final all-correct gap {gap['mean']:+.3f} "
                          f"[{gap['ci95'][0]:+.3f}, {gap['ci95'][1]:+.3f}] (95 % bootstrap over seeds)")


def papo_part(args, summary: dict, tables: list[str]) -> None:
    path, fingerprint, profile, chosen, _ = pinned_warm_start(args, "multi_add")
    require(chosen, "easy")
    n = chosen["easy"]
    best, _ = tune(args, path, "multi_add", PAPO_VARIANTS, n, seeds=args.papo_seeds[:1])
    runs = run_all(args, path, "multi_add", [spec(args, v, n, best[v], s) for v in PAPO_VARIANTS if v in best
                                              for s in args.papo_seeds])
    metric = {"sparse": "frac_reward_zero_std", "papo": "papo/zero_advantage_fraction",
              "papo_mult": "papo/zero_advantage_fraction"}
    report, rows = {}, []
    for variant in [v for v in PAPO_VARIANTS if v in best]:
        results = [runs[k] for k in sorted(runs) if k[0] == variant]
        zero = [logged_mean(r, metric[variant]) for r in results]
        late = [last_logged(r, metric[variant]) for r in results]
        report[variant] = {"zero_adv_frac": mean_of_present(zero), "zero_adv_frac_last_window": mean_of_present(late),
                           "final_all_correct": [final(r, "all_correct") for r in results],
                           "final_per_subproblem": [final(r, "per_subproblem") for r in results], "lr": best[variant]}
        rows.append([VARIANT_LABELS[variant], f"{best[variant]:g}", _fmt(report[variant]["zero_adv_frac"]),
                     _fmt(report[variant]["zero_adv_frac_last_window"]),
                     f"{results[0]['history'][0]['all_correct']:.3f}",
                     f"{statistics.fmean(report[variant]['final_all_correct']):.3f}",
                     f"{statistics.fmean(report[variant]['final_per_subproblem']):.3f}"])
    tables.append(f"### PAPO at the easy horizon (n = {n}, base all-correct {profile[n]['all_correct']:.3f}; "
                  f"{len(args.papo_seeds)} seeds)\n\n" + markdown_table(
                      ["variant", "lr", "rows with zero advantage (mean over training)", "same, last window",
                       "step-0 all-correct", "final all-correct", "final per-sub-problem"], rows))
    summary["papo"] = {"n": n, "zero_adv_frac": {"grpo": report.get("sparse", {}).get("zero_adv_frac"),
                                                 "papo": report.get("papo", {}).get("zero_adv_frac"),
                                                 "papo_mult": report.get("papo_mult", {}).get("zero_adv_frac")},
                       "details": report}


def arg_part(args, summary: dict, tables: list[str]) -> None:
    env = "multi_add_any_order"
    path, fingerprint, profile, _, _ = pinned_warm_start(args, env)
    # Where ARG acts: the smallest n whose base all-correct is in (0, 0.1] — most groups fail entirely, yet the task
    # is solvable (the cliff rule's line condition is not needed: guidance supplies the lines a group cannot write).
    solvable = [n for n in sorted(profile) if 0 < profile[n]["all_correct"] <= 0.1]
    if args.quick:
        solvable = [2]
    if not solvable:
        raise SystemExit(f"{env}: no horizon with base all-correct in (0, 0.1]; nothing to measure")
    n, lr = solvable[0], summary.get("ppm", {}).get("details", {}).get("best_lr", {}).get("sparse", 1e-4)
    runs = run_all(args, path, env, [spec(args, v, n, lr, s) for v in ARG_VARIANTS for s in args.arg_seeds])
    report, rows = {}, []
    for variant in ARG_VARIANTS:
        results = [runs[k] for k in sorted(runs) if k[0] == variant]
        if not results:
            continue
        failed = sum(logged_sum(r, "arg/all_failure_groups") for r in results)
        rescued = sum(logged_sum(r, "arg/groups_with_accepted") for r in results)
        levels = sorted({name.rsplit("/", 1)[1] for r in results for log in r.get("train_logs", [])
                         for name in log if name.startswith("arg/correct_rate/")})
        per_level = {}
        for level in levels:
            per_level[level] = {what: mean_of_present(logged_mean(r, f"arg/{what}_rate/{level}") for r in results)
                                for what in ("correct", "copy", "success", "acceptance")}
        report[variant] = {"rescue_rate": rescued / failed if failed else None, "all_failure_groups": failed,
                           "groups_with_accepted": rescued, "per_level": per_level,
                           "final_all_correct": [final(r, "all_correct") for r in results]}
        rows.append([VARIANT_LABELS[variant], f"{failed:.0f}", f"{rescued:.0f}",
                     f"{rescued / failed:.3f}" if failed else "–",
                     "; ".join(f"{lv}: correct {_fmt(m['correct'])} copy {_fmt(m['copy'])} accepted "
                               f"{_fmt(m['acceptance'])}" for lv, m in per_level.items()) or "–",
                     f"{statistics.fmean(report[variant]['final_all_correct']):.3f}"])
    tables.append(f"### ARG on {env} (n = {n}, base all-correct {profile[n]['all_correct']:.3f}; lr {lr:g}; "
                  f"{len(args.arg_seeds)} seeds; warm start {fingerprint})\n\n" + markdown_table(
                      ["variant", "all-failure groups", "rescued (accepted a candidate)", "rescue rate",
                       "continuations per α", "final all-correct"], rows))
    summary["arg"] = {"task": env, "n": n, "warm_start_fingerprint": fingerprint,
                      "rescue_rate": {"arg": report.get("arg", {}).get("rescue_rate"),
                                      "reference_insertion": report.get("reference_insertion", {}).get("rescue_rate"),
                                      "fixed_prefix": report.get("fixed_prefix", {}).get("rescue_rate")},
                      "details": report}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.quick:
        args.output_dir = args.output_dir + "_quick"
        args.lrs, args.seeds, args.papo_seeds, args.arg_seeds = [1e-4], [0], [0], [0]
        args.steps, args.eval_every, args.eval_size, args.bootstrap = 2, 1, 8, 100
    os.makedirs(args.output_dir, exist_ok=True)
    summary: dict = {"command": "python benchmarks/evidence.py " + " ".join(argv or []), "settings": vars(args)}
    tables: list[str] = []
    for part in ("ppm", "papo", "arg"):  # arg reads GRPO's tuned lr from the ppm part
        if part in args.parts:
            {"ppm": ppm_part, "papo": papo_part, "arg": arg_part}[part](args, summary, tables)
    name = "summary.json" if set(args.parts) == {"ppm", "papo", "arg"} else f"summary_{'_'.join(args.parts)}.json"
    with open(os.path.join(args.output_dir, name), "w") as handle:
        json.dump(summary, handle, indent=2, default=str)
    with open(os.path.join(args.output_dir, "tables.md"), "w") as handle:
        handle.write("\n\n".join(tables) + "\n")
    print("\n\n".join(tables), flush=True)
    return summary


if __name__ == "__main__":
    main()
