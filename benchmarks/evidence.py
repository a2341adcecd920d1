"""Each paper's headline, measured the way its paper measures it, under one protocol (issue 30).

    python benchmarks/evidence.py --parts ppm --workers 2        # one part; resumes from the cached runs
    python benchmarks/evidence.py --parts ppm --plan             # what is cached and what is left (trains nothing)
    python benchmarks/evidence.py --summarize-only               # summary.json, tables.md and plots from the cache
    python benchmarks/evidence.py --quick                        # CI smoke (tiny warm starts, 2 steps)

**Protocol** (all parts). Every run is one `ppm_trl.demo.train_variant` on one thread with deterministic algorithms
and the pinned kernels (`ppm_trl.demo.kernels`: the script re-executes itself with them, so any x86-64 CPU computes
the same numbers), cached as JSON under `--output-dir/runs/` (so the suite runs in pieces, across sessions and
machines). Learning rates: a grid of ≥ 3 values per variant (`--lrs`), each variant at its best value by
mean final all-correct at T = 1 (ties: per-sub-problem accuracy) over the *tuning* seeds (`--tuning-seeds`), evaluated
on a *tuning* prompt set; a variant whose best value sits at an edge of its grid gets the grid extended on that side
(×/÷ `--lr-step`, up to `--max-extensions` times). Reported: the *reporting* seeds (`--seeds`, disjoint from the tuning
seeds) on `--eval-size` held-out prompts disjoint from the tuning prompts, evaluated at T = 1 and greedy (and pass@k
where the paper reports it), mean with a t-based 95 % interval, paired by seed between variants (every variant of a
part starts from the same warm start and sees the same prompts in the same order for a given seed). A samples-to-target
that a run never reaches is censored and shown as "> budget", never as a number.

Parts:
* **ppm** (PPM §5.2 Table 1, Fig. 4) on `multi_add` from the pinned warm start: GRPO (sparse), trajectory-level PPM and
  line-segment PPM at every horizon of `--horizons`, equal chunks too at the hardest; tuned at the hardest horizon.
  Target at horizon n: all-correct ≥ `--target-line`ⁿ (every line right with that probability). Headline: the final
  gap (line segments − GRPO) against n at T = 1 and greedy, and GRPO / PPM samples-to-target at the hardest n.
* **ppm_robust**: the hardest-horizon comparison (GRPO vs line segments, the lrs tuned in `ppm`) again on `chain_add`,
  whose warm start learned from clean references (its cliff is a competence limit), at the cliff of its profile. The
  recipe (1,542 SFT steps) solves n = 2..8 (no cliff), so the same SFT stopped earlier is tried next
  (`--robust-sft-steps`): the first warm start whose profile has a cliff is the one measured.
* **papo** (PAPO §5.3, §6, §3.2) on `multi_add_boxed`, whose outcome is the box alone, from a warm start whose box
  states the true sums while 40 % of its work lines are wrong: correct answers differ in process (programmatic
  process score = fraction of right lines). Arms: GRPO, PAPO, PAPO Fullnorm, multiplicative, and PRM-only on a
  gameable process score (`shown_work_reward`: work lines shown, unchecked) as the reward-hacking arm.
* **arg** (ARG §5, App. G.2) on `multi_add_any_order` at the smallest n whose base all-correct is in (0, 0.1]: ARG,
  resampling (α = 1 only), fixed α = ½, fixed α = ¼, reference insertion and GRPO, every arm at GRPO's tuned lr on
  this task (the arms share the optimiser; only the guidance differs). pass@1 / pass@8 / avg@8 at the end.

Everything reported goes to `--output-dir/summary.json` (written from the runs), tables to `tables.md`, plots next to
them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict

from common import RESULTS, markdown_table, samples_to_target

from ppm_trl.demo import VARIANT_LABELS, RunSpec, choose_horizons, format_profile, profile_warm_start, train_variant
from ppm_trl.demo.kernels import pin_kernels
from ppm_trl.demo.warmstart import WarmStartSettings, read_manifest, warm_start
from ppm_trl.envs import make_dataset

PPM_VARIANTS = ["sparse", "trajectory", "lines"]
PPM_HARDEST_ONLY = ["segment"]  # equal chunks, at the hardest horizon
PAPO_ARMS = {"grpo": "sparse", "papo": "papo", "papo_fullnorm": "papo_fullnorm", "papo_mult": "papo_mult",
             "prm_only": "prm_only"}
ARG_ARMS = {"arg": "arg", "resampling": "resampling", "fixed_half": "fixed_prefix", "fixed_quarter": "fixed_quarter",
            "reference_insertion": "reference_insertion", "grpo": "sparse"}
SAMPLES_PER_STEP = 64
PARTS = ["ppm", "ppm_robust", "papo", "arg"]  # in this order: ppm_robust reads ppm's tuned lrs from the summary
# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (the standard table).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    parser.add_argument("--horizons", type=int, nargs="+", default=[2, 4, 6, 8], help="PPM's horizons n.")
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4], help="The lr grid (≥ 3 values).")
    parser.add_argument("--lr-step", type=float, default=3.0, help="Factor by which an edge grid is extended.")
    parser.add_argument("--max-extensions", type=int, default=2, help="Extensions of a grid per side, at most.")
    parser.add_argument("--tuning-seeds", type=int, nargs="+", default=[100, 101])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Reporting seeds.")
    parser.add_argument("--ppm-steps", type=int, default=100, help="PPM RL steps per run (64 samples each).")
    parser.add_argument("--papo-steps", type=int, default=60)
    parser.add_argument("--arg-steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=256, help="Held-out (and tuning) prompts per evaluation.")
    parser.add_argument("--target-line", type=float, default=0.65,
                        help="PPM's target at horizon n is all-correct ≥ target_line ** n.")
    parser.add_argument("--papo-n", type=int, default=3, help="PAPO's horizon.")
    parser.add_argument("--robust-sft-steps", type=int, nargs="+", default=[1542, 1400, 1300, 1350, 1375, 1325, 1315, 1310],
                        help="ppm_robust's chain_add warm starts, tried in order: the recipe (1,542 SFT steps), then the "
                             "same recipe stopped earlier, closing in on the jump in which it learns the task (1,400: "
                             "no cliff yet, 1,300: every line a wall); the first whose profile has a cliff is used.")
    parser.add_argument("--profile-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1, help="Runs in parallel (processes, one thread each).")
    parser.add_argument("--output-dir", default=os.path.join(RESULTS, "evidence_v3"),
                        help="Runs, profiles and summary (default: protocol 3's, under the pinned kernels; "
                             "benchmarks/results/evidence holds protocol 2's, measured before the pin).")
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache root.")
    parser.add_argument("--tune-only", action="store_true", help="Stop each part after its lr grid.")
    parser.add_argument("--plan", action="store_true", help="Print what is cached and what is left; train nothing.")
    parser.add_argument("--summarize-only", action="store_true", help="Train nothing; summarise the cached runs.")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny warm starts, 2 steps, 1 seed.")
    args = parser.parse_args(argv)
    if args.quick:
        args.output_dir += "_quick"
        args.horizons, args.lrs, args.tuning_seeds, args.seeds = [1, 2], [1e-4, 1e-3], [100], [0, 1]
        args.ppm_steps = args.papo_steps = args.arg_steps = 2
        args.eval_every, args.eval_size, args.profile_size, args.max_extensions, args.papo_n = 1, 8, 8, 0, 2
    if len(args.lrs) < 3 and not args.quick:
        parser.error("--lrs needs at least three values (a grid that can bracket an optimum)")
    if set(args.tuning_seeds) & set(args.seeds):
        parser.error(f"--tuning-seeds and --seeds must be disjoint; both have {sorted(set(args.tuning_seeds) & set(args.seeds))}")
    args.plan_only = args.plan or args.summarize_only
    return args


# ------------------------------------------------------------------------------------------------------ statistics
def t_interval(values: list[float]) -> tuple[float, list[float] | None]:
    """(mean, [low, high]) with a two-sided 95 % Student-t interval; None for fewer than two values."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    half = T975[min(len(values) - 2, len(T975) - 1)] * statistics.stdev(values) / math.sqrt(len(values))
    return mean, [mean - half, mean + half]


def final(result: dict, key: str = "all_correct") -> float:
    return result["history"][-1][key]


def logged_series(result: dict, name: str) -> list[tuple[int, float]]:
    """(step, value) of a training metric over the logging windows (TRL averages each window)."""
    return [(log["step"], log[name]) for log in result.get("train_logs", []) if name in log]


def logged_mean(result: dict, name: str) -> float | None:
    values = [value for _, value in logged_series(result, name)]
    return statistics.fmean(values) if values else None


def logged_sum(result: dict, name: str) -> float:
    """Σ over steps of a per-step count metric (window mean × window length)."""
    total, previous = 0.0, 0
    for log in result.get("train_logs", []):
        if name in log:
            total += log[name] * (log["step"] - previous)
        previous = log["step"]
    return total


def mean_or_none(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def fmt(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def fmt_interval(values: list[float]) -> str:
    mean, interval = t_interval(values)
    return f"{mean:.3f}" + ("" if interval is None else f" [{interval[0]:.3f}, {interval[1]:.3f}]")


# ------------------------------------------------------------------------------------------------------------ runs
PENDING: list[str] = []  # runs that `--plan` / `--summarize-only` found missing


class Runner:
    """Trains (or reads from the cache) the runs of one warm start; every run is one JSON file."""

    def __init__(self, args, env: str, model_path: str, folder: str | None = None):
        self.args, self.env, self.model_path, self.folder = args, env, model_path, folder or env

    def role(self, seed: int) -> str:
        return "tune" if seed in self.args.tuning_seeds else "report"

    def path(self, spec: RunSpec) -> str:
        return os.path.join(self.args.output_dir, "runs", self.folder, f"{spec.variant}_n{spec.n}_lr{spec.learning_rate:g}"
                            f"_s{spec.seed}_{spec.max_steps}st.json")

    def run(self, specs: list[RunSpec]) -> dict[tuple, dict]:
        """{(variant, n, lr, seed): result} of `specs` that are cached or trained now (`--plan`: cached only)."""
        results, todo = {}, []
        for spec in specs:
            key, path = (spec.variant, spec.n, spec.learning_rate, spec.seed), self.path(spec)
            if os.path.exists(path):
                with open(path) as handle:
                    results[key] = json.load(handle)
            else:
                todo.append((key, spec, path))
        if not todo:
            return results
        if self.args.plan_only:
            PENDING.extend(os.path.relpath(path, self.args.output_dir) for _, _, path in todo)
            return results
        print(f"  {self.env}: {len(todo)} run(s) to train, {self.args.workers} at a time", flush=True)
        jobs = [(self.model_path, self.env, spec, self.args.eval_size, self.role(spec.seed), path)
                for _, spec, path in todo]
        if self.args.workers == 1:
            for (key, *_), job in zip(todo, jobs):
                results[key] = _run_job(*job)
                report(key, results[key])
            return results
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(self.args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_run_job, *job): key for (key, *_), job in zip(todo, jobs)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                report(futures[future], results[futures[future]])
        return results


def report(key: tuple, result: dict) -> None:
    first, last = result["history"][0], result["history"][-1]
    print(f"    {key[0]:>20} n={key[1]} lr={key[2]:g} seed={key[3]}: all-correct {first['all_correct']:.3f} → "
          f"{last['all_correct']:.3f}, greedy {first['greedy_all_correct']:.3f} → {last['greedy_all_correct']:.3f}, "
          f"per-sub {first['per_subproblem']:.3f} → {last['per_subproblem']:.3f} ({result['wall_seconds']:.0f}s)",
          flush=True)


def eval_set(env: str, n: int, role: str, size: int):
    """The held-out prompts (`report`), or the tuning prompts (`tune`): another draw with every held-out prompt
    removed, so tuning never sees a prompt it is reported on."""
    held_out = make_dataset(env, n, size, seed=90_000 + n)
    if role == "report":
        return held_out
    seen = {json.dumps(row["prompt"]) for row in held_out}
    pool = make_dataset(env, n, 3 * size, seed=80_000 + n)
    keep = [i for i, row in enumerate(pool) if json.dumps(row["prompt"]) not in seen][:size]
    if len(keep) < size:
        raise SystemExit(f"{env} n={n}: only {len(keep)} tuning prompts disjoint from the held-out ones")
    return pool.select(keep)


def _run_job(model_path: str, env: str, spec: RunSpec, eval_size: int, role: str, path: str) -> dict:
    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        result = train_variant(model_path, spec, eval_set(env, spec.n, role, eval_size), scratch, progress=False)
    result.update(wall_seconds=time.time() - started, eval_role=role, env=env)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(path + ".tmp", path)
    return result


def spec(variant: str, n: int, lr: float, seed: int, steps: int, eval_every: int, pass_k: int = 0) -> RunSpec:
    return RunSpec(variant=variant, n=n, learning_rate=lr, max_steps=steps, eval_every=eval_every, seed=seed,
                   pass_k=pass_k)


def outcome_score(result: dict) -> tuple[float, float]:
    """What a variant is tuned for: final all-correct at T = 1, ties broken by per-sub-problem accuracy."""
    return final(result), final(result, "per_subproblem")


def own_reward_score(result: dict) -> tuple[float, float]:
    """The PRM-only arm is tuned for what it optimises, its own reward (last logging window): an arm tuned for the
    accuracy it is meant to show losing would be tuned not to train (the grid table shows its accuracy at every lr)."""
    return logged_series(result, "rewards/shown_work_reward/mean")[-1][1], final(result)


def tune(args, runner: Runner, variants: list[str], n: int, steps: int, scores: dict | None = None) -> dict:
    """Each variant's best lr at horizon n over the tuning seeds, extending a grid whose best is at an edge.

    Returns {variant: {"best": lr | None, "grid": {lr: {"per_seed": [...], "mean": ..., "per_sub": ...}},
    "at_edge": bool}}; "best" is None while a grid cell is not trained (`--plan`). The grids of all variants are
    trained together, one extension round at a time. `scores[variant]` (default `outcome_score`) ranks a run."""
    scores = scores or {}
    grids = {variant: sorted(args.lrs) for variant in variants}
    out, open_ = {}, list(variants)
    for _ in range(args.max_extensions + 1):
        runs = runner.run([spec(v, n, lr, s, steps, args.eval_every) for v in open_ for lr in grids[v]
                           for s in args.tuning_seeds])
        still_open = []
        for variant in open_:
            lrs, grid = grids[variant], {}
            for lr in lrs:
                cell = [runs[(variant, n, lr, s)] for s in args.tuning_seeds if (variant, n, lr, s) in runs]
                if len(cell) == len(args.tuning_seeds):
                    ranked = [scores.get(variant, outcome_score)(r) for r in cell]
                    grid[lr] = {"per_seed": [final(r) for r in cell], "mean": statistics.fmean(final(r) for r in cell),
                                "per_sub": statistics.fmean(final(r, "per_subproblem") for r in cell),
                                "score": [statistics.fmean(column) for column in zip(*ranked)]}
            if len(grid) < len(lrs):
                out[variant] = {"best": None, "grid": grid, "at_edge": None}
                continue
            best = max(lrs, key=lambda lr: grid[lr]["score"])
            out[variant] = {"best": best, "grid": grid, "at_edge": best in (lrs[0], lrs[-1])}
            if best == lrs[0]:
                grids[variant] = [float(f"{lrs[0] / args.lr_step:.3g}")] + lrs
            elif best == lrs[-1]:
                grids[variant] = lrs + [float(f"{lrs[-1] * args.lr_step:.3g}")]
            else:
                continue
            still_open.append(variant)
        open_ = still_open
        if not open_:
            break
    return {variant: out[variant] for variant in variants}


def grid_table(title: str, tuned: dict, n: int) -> str:
    rows = []
    for variant, info in tuned.items():
        for lr, cell in sorted(info["grid"].items()):
            rows.append([VARIANT_LABELS[variant], f"{lr:g}", " ".join(f"{v:.3f}" for v in cell["per_seed"]),
                         f"{cell['mean']:.3f}", f"{cell['per_sub']:.3f}", f"{cell['score'][0]:.3f}",
                         ("best" + (" (edge)" if info["at_edge"] else "")) if lr == info["best"] else ""])
    return f"### {title} (n = {n}; tuning seeds, tuning prompts; final all-correct at T = 1)\n\n" + markdown_table(
        ["variant", "lr", "final all-correct per tuning seed", "mean", "mean per-sub-problem", "ranked by", ""], rows)


def pinned_warm_start(args, env: str, horizons: list[int], label: str = "", **overrides) -> tuple[str, str, dict]:
    """(path, fingerprint, profile by n) of `env`'s recipe warm start (with `overrides`, whose profile file carries
    `label`); the profile is cached next to the runs."""
    settings = WarmStartSettings.for_env(env, **overrides)
    if args.quick:
        settings = WarmStartSettings(env=env, horizons=(1, 2), num_examples=64, max_steps=2, batch_size=8,
                                     hidden_size=32, num_hidden_layers=1)
    profile_file = os.path.join(args.output_dir, f"profile_{env}{label}.json")
    stored = None
    if os.path.exists(profile_file):
        with open(profile_file) as handle:
            stored = json.load(handle)
        if args.plan_only and all(str(n) in stored["profile"] for n in horizons):
            # --plan / --summarize-only read the runs of the warm start they were measured on; nothing is built
            # (runs measured under other kernels stay readable).
            profile = {int(n): v for n, v in stored["profile"].items()}
            print(f"{env}: warm start {stored['fingerprint']} (as stored; not rebuilt)\n"
                  f"{format_profile({n: profile[n] for n in horizons})}", flush=True)
            return "", stored["fingerprint"], profile
    path = warm_start(settings, cache_root=args.cache_dir, progress=False)
    fingerprint = read_manifest(path)["weights_digest"]
    profile = {}
    if stored is not None:
        if stored["fingerprint"] != fingerprint:
            raise SystemExit(f"{args.output_dir} holds runs of warm start {stored['fingerprint']} for {env}; this "
                             f"machine built {fingerprint}. Use another --output-dir (or delete the old runs).")
        profile = {int(n): v for n, v in stored["profile"].items()}
    missing = [n for n in horizons if n not in profile]
    if missing:
        profile.update(profile_warm_start(path, env, missing, args.profile_size))
        os.makedirs(args.output_dir, exist_ok=True)
        with open(profile_file, "w") as handle:
            json.dump({"fingerprint": fingerprint, "settings": asdict(settings),
                       "profile": {str(n): profile[n] for n in sorted(profile)}}, handle, indent=2)
    print(f"{env}: warm start {fingerprint} ({path})\n{format_profile({n: profile[n] for n in horizons})}", flush=True)
    return path, fingerprint, profile


# ------------------------------------------------------------------------------------------------------------- PPM
def ppm_part(args, summary: dict, tables: list[str]) -> None:
    env, horizons = "multi_add", sorted(args.horizons)
    path, fingerprint, profile = pinned_warm_start(args, env, horizons)
    summary["warm_start_fingerprint"] = fingerprint
    runner, hardest, steps = Runner(args, env, path), horizons[-1], args.ppm_steps
    tuned = tune(args, runner, PPM_VARIANTS + PPM_HARDEST_ONLY, hardest, steps)
    tables.append(grid_table("PPM: lr grid at the hardest horizon", tuned, hardest))
    ppm = {"horizons": horizons, "hardest_n": hardest, "reporting_seeds": args.seeds, "tuning_seeds": args.tuning_seeds,
           "steps": steps, "samples_budget": steps * SAMPLES_PER_STEP, "target_line": args.target_line,
           "lr_grid": {v: sorted(info["grid"]) for v, info in tuned.items()},
           "best_lr": {v: info["best"] for v, info in tuned.items()},
           "best_lr_at_edge": any(info["at_edge"] for info in tuned.values()),
           "profile": {str(n): profile[n] for n in horizons}}
    summary["ppm"] = ppm
    if args.tune_only or any(info["best"] is None for info in tuned.values()):
        return
    specs = [spec(v, n, tuned[v]["best"], s, steps, args.eval_every) for n in horizons for v in PPM_VARIANTS
             for s in args.seeds]
    specs += [spec(v, hardest, tuned[v]["best"], s, steps, args.eval_every) for v in PPM_HARDEST_ONLY
              for s in args.seeds]
    runs = runner.run(specs)
    if len(runs) < len(specs):
        return
    by_n, rows = {}, []
    for n in horizons:
        target = args.target_line ** n
        censor = steps * SAMPLES_PER_STEP
        cell = {}
        for variant in PPM_VARIANTS + (PPM_HARDEST_ONLY if n == hardest else []):
            results = [runs[(variant, n, tuned[variant]["best"], s)] for s in args.seeds]
            reached = [samples_to_target(r["history"], target) for r in results]
            cell[variant] = {
                "final_all_correct": [final(r) for r in results],
                "final_greedy_all_correct": [final(r, "greedy_all_correct") for r in results],
                "final_per_subproblem": [final(r, "per_subproblem") for r in results],
                "start_all_correct": results[0]["history"][0]["all_correct"],
                "start_greedy_all_correct": results[0]["history"][0]["greedy_all_correct"],
                "samples_to_target": reached, "lr": tuned[variant]["best"],
                "trainable_fraction": mean_or_none(
                    logged_mean(r, "ppm/frac_groups_nonzero_advantage") or
                    (None if logged_mean(r, "frac_reward_zero_std") is None else 1 - logged_mean(r, "frac_reward_zero_std"))
                    for r in results)}
            c = cell[variant]
            rows.append([str(n), f"{target:.3f}", VARIANT_LABELS[variant], f"{c['lr']:g}",
                         f"{c['start_all_correct']:.3f} / {c['start_greedy_all_correct']:.3f}",
                         fmt_interval(c["final_all_correct"]), fmt_interval(c["final_greedy_all_correct"]),
                         fmt_interval(c["final_per_subproblem"]),
                         " ".join(str(s) if s is not None else f">{censor}" for s in reached),
                         fmt(c["trainable_fraction"])])
        for key, name in (("final_all_correct", "gap"), ("final_greedy_all_correct", "gap_greedy")):
            per_seed = [a - b for a, b in zip(cell["lines"][key], cell["sparse"][key])]
            mean, interval = t_interval(per_seed)
            cell[name] = {"per_seed": per_seed, "mean": mean, "ci95": interval}
        by_n[n] = cell
    tables.append(f"### PPM by horizon (warm start {fingerprint}; {len(args.seeds)} reporting seeds, {args.eval_size} "
                  f"held-out prompts; {steps * SAMPLES_PER_STEP} samples per run; mean [t 95 % interval])\n\n"
                  + markdown_table(["n", "target", "variant", "lr", "step-0 all-correct (T=1 / greedy)",
                                    "final all-correct T=1", "final all-correct greedy", "final per-sub-problem",
                                    "samples to target per seed", "groups with a non-zero advantage"], rows))
    gap_rows = [[str(n), fmt_interval(by_n[n]["gap"]["per_seed"]), fmt_interval(by_n[n]["gap_greedy"]["per_seed"])]
                for n in horizons]
    tables.append("### PPM: final all-correct gap, line segments − GRPO, paired by seed (mean [t 95 % interval])\n\n"
                  + markdown_table(["n", "gap at T = 1", "gap greedy"], gap_rows))
    # Samples-to-target ratio at the hardest n, paired by seed; a censored GRPO run counts at the budget (a lower
    # bound of its ratio); a censored PPM run leaves its seed's ratio undefined.
    grpo, lines = by_n[hardest]["sparse"]["samples_to_target"], by_n[hardest]["lines"]["samples_to_target"]
    ratios = [(g if g is not None else censor) / p for g, p in zip(grpo, lines) if p]
    log_mean, log_interval = t_interval([math.log(r) for r in ratios]) if ratios else (None, None)
    ppm.update(
        gap_by_n={str(n): by_n[n]["gap"]["mean"] for n in horizons},
        gap_by_n_greedy={str(n): by_n[n]["gap_greedy"]["mean"] for n in horizons},
        gap_ci95_by_n={str(n): by_n[n]["gap"]["ci95"] for n in horizons},
        gap_ci95_by_n_greedy={str(n): by_n[n]["gap_greedy"]["ci95"] for n in horizons},
        ratio_per_seed=ratios, ratio_median=statistics.median(ratios) if ratios else None,
        ratio_ci95=None if log_interval is None else [math.exp(v) for v in log_interval],
        ratio_geometric_mean=None if log_mean is None else math.exp(log_mean),
        censored=any(g is None for g in grpo), ppm_censored=any(p is None for p in lines),
        grpo_reached_target_at=[n for n in horizons if any(s is not None for s in by_n[n]["sparse"]["samples_to_target"])],
        details={str(n): by_n[n] for n in horizons})
    tables.append(f"PPM (line segments) vs GRPO at n = {hardest}: samples to {args.target_line}^{hardest} = "
                  f"{args.target_line ** hardest:.3f} all-correct, GRPO / PPM per seed "
                  f"{' '.join(f'{r:.2f}' for r in ratios) or '–'}; median {fmt(ppm['ratio_median'], 2)}, geometric "
                  f"mean {fmt(ppm['ratio_geometric_mean'], 2)} with t 95 % interval "
                  f"{'–' if ppm['ratio_ci95'] is None else '[{:.2f}, {:.2f}]'.format(*tuple(ppm['ratio_ci95']))}"
                  + (" — a lower bound: GRPO seeds censored at the budget" if ppm["censored"] else ""))
    plot_ppm(args, ppm, by_n, horizons)


def plot_ppm(args, ppm: dict, by_n: dict, horizons: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for variant in PPM_VARIANTS:
        for ax, key in zip(axes[:2], ("final_all_correct", "final_greedy_all_correct")):
            stats = [t_interval(by_n[n][variant][key]) for n in horizons]
            means = [m for m, _ in stats]
            errors = [[m - (i[0] if i else m) for m, i in stats], [(i[1] if i else m) - m for m, i in stats]]
            ax.errorbar(horizons, means, yerr=errors, marker="o", capsize=3, label=VARIANT_LABELS[variant])
        reached = [[s for s in by_n[n][variant]["samples_to_target"]] for n in horizons]
        axes[2].plot(horizons, [statistics.median(s if s is not None else ppm["samples_budget"] for s in r)
                                for r in reached], marker="o", label=VARIANT_LABELS[variant])
        for n, r in zip(horizons, reached):
            for s in r:
                if s is None:
                    axes[2].scatter([n], [ppm["samples_budget"]], marker="^", facecolors="none", edgecolors="gray")
    axes[2].axhline(ppm["samples_budget"], color="gray", lw=0.8, ls="--")
    save_figure(fig, axes, ("final all-correct, T = 1", "final all-correct, greedy",
                            f"samples to {args.target_line}^n (median; ▲ censored)"), "horizon n",
                os.path.join(args.output_dir, "ppm_horizons.png"))


def save_figure(fig, axes, titles, xlabel: str, path: str) -> None:
    """Title, label and grid each panel, legend the first, write `path`."""
    import matplotlib.pyplot as plt

    for ax, title in zip(axes, titles):
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def first_line_only(entry: dict) -> dict:
    """chain_add's lines are chained (line k is right only while the running value is), so its last line is right
    about as often as the whole answer and the per-line floor that tells a wall from a cliff on independent lines
    would refuse every chain_add cliff. The floor is applied to line 1, the only line that stands alone; the
    all-correct window and the monotone fall apply as on multi_add."""
    return {**entry, "per_point": list(entry.get("per_point") or [])[:1]}


def ppm_robust_part(args, summary: dict, tables: list[str]) -> None:
    """PPM's hardest-horizon comparison again on `chain_add`, whose warm start learned from clean references: its
    cliff is a competence limit (carried running values mod 10), not injected noise. GRPO and line segments at the
    lrs tuned on multi_add (the `ppm` part must have tuned them), at the cliff that the horizon rule picks."""
    best = summary.get("ppm", {}).get("best_lr", {})
    if best.get("sparse") is None or best.get("lines") is None:
        print("ppm_robust: waits for the ppm part's tuned learning rates (run --parts ppm first)", flush=True)
        return
    env, steps = "chain_add", args.ppm_steps
    horizons = [1, 2] if args.quick else list(range(2, 9))
    recipe_steps = WarmStartSettings.for_env(env).max_steps
    tried = {}
    for sft_steps in args.robust_sft_steps:
        label = "" if sft_steps == recipe_steps else f"_sft{sft_steps}"
        path, fingerprint, profile = pinned_warm_start(args, env, horizons, label, max_steps=sft_steps)
        chosen, reasons = choose_horizons({n: first_line_only(profile[n]) for n in horizons})
        tried[str(sft_steps)] = {"warm_start_fingerprint": fingerprint, "cliff": chosen["cliff"],
                                 "profile": {str(k): profile[k] for k in horizons}, "horizon_reasons": reasons}
        if chosen["cliff"] is not None or args.quick:
            break
    n = 2 if args.quick else chosen["cliff"]
    robust = {"task": env, "sft_steps": sft_steps, "warm_starts_tried": tried, "warm_start_fingerprint": fingerprint,
              "horizon_reasons": reasons, "n": n, "profile": {str(k): profile[k] for k in horizons},
              "reporting_seeds": args.seeds, "lr": {"sparse": best["sparse"], "lines": best["lines"]}}
    summary["ppm_robust"] = robust
    if n is None:
        robust["result"] = f"no cliff by the horizon rule at any of SFT steps {args.robust_sft_steps}: nothing measured"
        return
    runner = Runner(args, env, path, env + label)
    specs = [spec(v, n, best[v], s, steps, args.eval_every) for v in ("sparse", "lines") for s in args.seeds]
    runs = runner.run(specs)
    if len(runs) < len(specs):
        return
    rows = []
    for key in ("all_correct", "greedy_all_correct", "per_subproblem"):
        finals = {v: [final(runs[(v, n, best[v], s)], key) for s in args.seeds] for v in ("sparse", "lines")}
        gap = [a - b for a, b in zip(finals["lines"], finals["sparse"])]
        robust[f"final_{key}"] = finals
        robust[f"gap_{key}"] = {"per_seed": gap, "mean": t_interval(gap)[0], "ci95": t_interval(gap)[1]}
        rows.append([key, fmt_interval(finals["sparse"]), fmt_interval(finals["lines"]), fmt_interval(gap)])
    target = args.target_line ** n
    reached = {v: [samples_to_target(runs[(v, n, best[v], s)]["history"], target) for s in args.seeds]
               for v in ("sparse", "lines")}
    robust["samples_to_target"] = reached
    tables.append(f"### PPM robustness: {env} (clean references; warm start {fingerprint}, {sft_steps} SFT steps), n = {n} by the horizon "
                  f"rule, base all-correct {profile[n]['all_correct']:.3f}; {len(args.seeds)} reporting seeds\n\n"
                  + markdown_table(["final metric", "GRPO", "PPM line segments", "gap (paired)"], rows)
                  + f"\n\nSamples to {target:.3f}: GRPO {reached['sparse']}, line segments {reached['lines']} "
                  "(None = censored)")


# ------------------------------------------------------------------------------------------------------------ PAPO
PAPO_ZERO_METRIC = {"sparse": "frac_reward_zero_std", "prm_only": "frac_reward_zero_std"}


def papo_part(args, summary: dict, tables: list[str]) -> None:
    env, n, steps = "multi_add_boxed", args.papo_n, args.papo_steps
    path, fingerprint, profile = pinned_warm_start(args, env, [n])
    runner = Runner(args, env, path)
    variants = list(PAPO_ARMS.values())
    tuned = tune(args, runner, variants, n, steps, scores={"prm_only": own_reward_score})
    tables.append(grid_table("PAPO: lr grid (PRM-only ranked by its own reward, the others by accuracy)", tuned, n))
    papo = {"task": env, "n": n, "warm_start_fingerprint": fingerprint, "reporting_seeds": args.seeds,
            "steps": steps, "lr_grid": {arm: sorted(tuned[v]["grid"]) for arm, v in PAPO_ARMS.items()},
            "best_lr": {arm: tuned[v]["best"] for arm, v in PAPO_ARMS.items()},
            "best_lr_at_edge": any(info["at_edge"] for info in tuned.values()), "profile": profile[n]}
    summary["papo"] = papo
    if args.tune_only or any(info["best"] is None for info in tuned.values()):
        return
    runs = runner.run([spec(v, n, tuned[v]["best"], s, steps, args.eval_every) for v in variants for s in args.seeds])
    if len(runs) < len(variants) * len(args.seeds):
        return
    report_, rows = {}, []
    for arm, variant in PAPO_ARMS.items():
        results = [runs[(variant, n, tuned[variant]["best"], s)] for s in args.seeds]
        zero_metric = PAPO_ZERO_METRIC.get(variant, "papo/zero_advantage_fraction")
        reward_metric = "rewards/shown_work_reward/mean" if variant == "prm_only" else None
        report_[arm] = {
            "lr": tuned[variant]["best"],
            "zero_adv_frac": mean_or_none(logged_mean(r, zero_metric) for r in results),
            "proc_active_frac": mean_or_none(logged_mean(r, "papo/proc_active_fraction") for r in results),
            "final_accuracy": [final(r) for r in results],
            "final_greedy_accuracy": [final(r, "greedy_all_correct") for r in results],
            "final_line_accuracy": [final(r, "per_subproblem") for r in results],
            "start_accuracy": results[0]["history"][0]["all_correct"],
            "start_line_accuracy": results[0]["history"][0]["per_subproblem"],
            "length_first_window": mean_or_none(logged_series(r, "completions/mean_length")[0][1] for r in results),
            "length_last_window": mean_or_none(logged_series(r, "completions/mean_length")[-1][1] for r in results),
            "gameable_score_first_last": None if reward_metric is None else [
                mean_or_none(logged_series(r, reward_metric)[0][1] for r in results),
                mean_or_none(logged_series(r, reward_metric)[-1][1] for r in results)],
            "curves": [{"history": r["history"], "zero_adv": logged_series(r, zero_metric),
                        "proc_active": logged_series(r, "papo/proc_active_fraction"),
                        "length": logged_series(r, "completions/mean_length")} for r in results]}
        a = report_[arm]
        rows.append([VARIANT_LABELS[variant], f"{a['lr']:g}", fmt(a["zero_adv_frac"]), fmt(a["proc_active_frac"]),
                     f"{a['start_accuracy']:.3f}", fmt_interval(a["final_accuracy"]),
                     fmt_interval(a["final_greedy_accuracy"]),
                     f"{a['start_line_accuracy']:.3f} → " + fmt_interval(a["final_line_accuracy"]),
                     f"{fmt(a['length_first_window'], 1)} → {fmt(a['length_last_window'], 1)}"])
    tables.append(f"### PAPO on {env} (n = {n}, warm start {fingerprint}; {len(args.seeds)} reporting seeds; "
                  f"mean [t 95 % interval])\n\n" + markdown_table(
                      ["arm", "lr", "rows with zero advantage (mean over training)", "groups with A_proc active",
                       "step-0 accuracy", "final accuracy T=1", "final accuracy greedy", "line accuracy",
                       "completion length (first → last window)"], rows))
    drop = [r["history"][0]["all_correct"] - final(r) for r in
            (runs[("prm_only", n, tuned["prm_only"]["best"], s)] for s in args.seeds)]
    papo.update(zero_adv_frac={arm: report_[arm]["zero_adv_frac"] for arm in PAPO_ARMS},
                final_accuracy={arm: statistics.fmean(report_[arm]["final_accuracy"]) for arm in PAPO_ARMS},
                final_accuracy_ci95={arm: t_interval(report_[arm]["final_accuracy"])[1] for arm in PAPO_ARMS},
                proc_active_frac={arm: report_[arm]["proc_active_frac"] for arm in PAPO_ARMS},
                prm_only_accuracy_drop=statistics.fmean(drop), details=report_)
    plot_papo(args, report_)


def plot_papo(args, report_: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for arm, data in report_.items():
        for ax, pick in zip(axes, (lambda c: [(h["step"], h["all_correct"]) for h in c["history"]],
                                   lambda c: [(h["step"], h["per_subproblem"]) for h in c["history"]],
                                   lambda c: c["zero_adv"], lambda c: c["length"])):
            series = [pick(c) for c in data["curves"]]
            steps = [s for s, _ in series[0]]
            ax.plot(steps, [statistics.fmean(v[i][1] for v in series) for i in range(len(steps))], marker="o",
                    label=arm)
    save_figure(fig, axes, ("accuracy (T = 1)", "line accuracy", "rows with zero advantage", "completion length"),
                "step", os.path.join(args.output_dir, "papo.png"))


# ------------------------------------------------------------------------------------------------------------- ARG
def arg_part(args, summary: dict, tables: list[str]) -> None:
    env, steps = "multi_add_any_order", args.arg_steps
    horizons = [1, 2] if args.quick else [2, 3, 4]
    path, fingerprint, profile = pinned_warm_start(args, env, horizons)
    # Where ARG acts: the smallest n whose base all-correct is in (0, 0.1] — most groups fail entirely, yet the task
    # is solvable.
    solvable = [n for n in horizons if 0 < profile[n]["all_correct"] <= 0.1] or ([2] if args.quick else [])
    if not solvable:
        raise SystemExit(f"{env}: no horizon with base all-correct in (0, 0.1]; nothing to measure")
    n, runner = solvable[0], Runner(args, env, path)
    tuned = tune(args, runner, ["sparse"], n, steps)
    tables.append(grid_table("ARG task: GRPO's lr grid (every arm trains at its best)", tuned, n))
    lr = tuned["sparse"]["best"]
    arg = {"task": env, "n": n, "warm_start_fingerprint": fingerprint, "reporting_seeds": args.seeds, "steps": steps,
           "lr": lr, "lr_grid": sorted(tuned["sparse"]["grid"]), "best_lr_at_edge": tuned["sparse"]["at_edge"],
           "profile": profile[n]}
    summary["arg"] = arg
    if args.tune_only or lr is None:
        return
    specs = [spec(v, n, lr, s, steps, args.eval_every, pass_k=8) for v in ARG_ARMS.values() for s in args.seeds]
    runs = runner.run(specs)
    if len(runs) < len(specs):
        return
    report_, rows = {}, []
    for arm, variant in ARG_ARMS.items():
        results = [runs[(variant, n, lr, s)] for s in args.seeds]
        failed = [logged_sum(r, "arg/all_failure_groups") for r in results]
        rescued = [logged_sum(r, "arg/groups_with_accepted") for r in results]
        levels = sorted({name.rsplit("/", 1)[1] for r in results for log in r.get("train_logs", [])
                         for name in log if name.startswith("arg/correct_rate/")})
        per_level = {level: {what: mean_or_none(logged_mean(r, f"arg/{what}_rate/{level}") for r in results)
                             for what in ("correct", "copy", "success", "acceptance")} for level in levels}
        report_[arm] = {
            "rescue_rate": sum(rescued) / sum(failed) if sum(failed) else None,
            "rescue_rate_per_seed": [r / f if f else None for r, f in zip(rescued, failed)],
            "all_failure_groups": sum(failed), "groups_with_accepted": sum(rescued), "per_level": per_level,
            **{key: [final(r, key) for r in results] for key in ("pass@1", "pass@8", "avg@8", "all_correct",
                                                                   "greedy_all_correct")},
            "selector_prob": {level: [logged_series(r, f"arg/selector_prob/{level}") for r in results]
                              for level in levels}}
        a = report_[arm]
        guided = variant != "sparse"  # GRPO guides nothing: no all-failure counts to show
        rows.append([VARIANT_LABELS[variant], f"{a['all_failure_groups']:.0f}" if guided else "–",
                     f"{a['groups_with_accepted']:.0f}" if guided else "–",
                     fmt(a["rescue_rate"]), " ".join(fmt(v) for v in a["rescue_rate_per_seed"]),
                     fmt_interval(a["pass@1"]), fmt_interval(a["pass@8"]), fmt_interval(a["avg@8"]),
                     fmt_interval(a["greedy_all_correct"]),
                     "; ".join(f"{lv}: correct {fmt(m['correct'])} copy {fmt(m['copy'])} accepted "
                               f"{fmt(m['acceptance'])}" for lv, m in per_level.items()) or "–"])
    tables.append(f"### ARG on {env} (n = {n}, base all-correct {profile[n]['all_correct']:.3f}; lr {lr:g}; "
                  f"{len(args.seeds)} reporting seeds; warm start {fingerprint}; mean [t 95 % interval])\n\n"
                  + markdown_table(["arm", "all-failure groups", "rescued", "rescue rate", "per seed", "pass@1",
                                    "pass@8", "avg@8", "greedy", "continuations per α"], rows))
    arg.update(rescue_rate={arm: report_[arm]["rescue_rate"] for arm in ARG_ARMS if arm != "grpo"},
               pass_at_8={arm: statistics.fmean(report_[arm]["pass@8"]) for arm in ARG_ARMS},
               pass_at_8_ci95={arm: t_interval(report_[arm]["pass@8"])[1] for arm in ARG_ARMS},
               pass_at_1={arm: statistics.fmean(report_[arm]["pass@1"]) for arm in ARG_ARMS}, details=report_)
    plot_arg(args, report_["arg"])


def plot_arg(args, arg_report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for level, per_seed in arg_report["selector_prob"].items():
        for i, series in enumerate(per_seed):
            if series:
                ax.plot([s for s, _ in series], [p for _, p in series], color=f"C{list(arg_report['selector_prob']).index(level)}",
                        alpha=0.8, label=level if i == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("selector probability")
    ax.set_title("ARG's selector over training (one line per seed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.output_dir, "arg_selector.png"), dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------------ main
def main(argv=None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    summary_path = os.path.join(args.output_dir, "summary.json")
    summary: dict = {}
    if os.path.exists(summary_path):  # parts not run now keep what an earlier invocation wrote
        with open(summary_path) as handle:
            summary = json.load(handle)
    summary.update(command="python benchmarks/evidence.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                   protocol={key: getattr(args, key) for key in (
                       "lrs", "lr_step", "max_extensions", "tuning_seeds", "seeds", "eval_every", "eval_size",
                       "target_line", "ppm_steps", "papo_steps", "arg_steps", "horizons", "papo_n")})
    tables_by_part: dict[str, list[str]] = summary.setdefault("tables", {})
    for part in PARTS:
        if part in args.parts:
            tables_by_part[part] = []
            {"ppm": ppm_part, "ppm_robust": ppm_robust_part, "papo": papo_part, "arg": arg_part}[part](
                args, summary, tables_by_part[part])
    # tables.md holds every part: those not run now keep the tables an earlier invocation wrote into summary.json.
    missing = [part for part in PARTS if part not in tables_by_part]
    if missing:
        print(f"tables.md: no tables yet for {', '.join(missing)} (run --parts {' '.join(missing)})", flush=True)
    tables = [table for part in PARTS for table in tables_by_part.get(part, [])]
    if PENDING:
        print(f"{len(PENDING)} run(s) of the next step not trained yet (later steps depend on them):\n  "
              + "\n  ".join(PENDING), flush=True)
    with open(summary_path, "w") as handle:
        json.dump(summary, handle, indent=2, default=str)
    with open(os.path.join(args.output_dir, "tables.md"), "w") as handle:
        handle.write("\n\n".join(tables) + "\n")
    print("\n\n".join(tables), flush=True)
    return summary


if __name__ == "__main__":
    pin_kernels()  # re-executes with the pinned kernels (ppm_trl.demo.kernels)
    main()
