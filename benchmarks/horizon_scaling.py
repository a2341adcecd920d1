"""Figure 4 of the PPM paper on our stack: sparse GRPO vs trajectory- vs segment-level PPM as the horizon grows.

Protocol (every run starts from the same cached SFT warm start, `ppm_trl.demo.warmstart`, and uses `train_variant`
from `ppm_trl.demo`, i.e. the real `GRPOTrainer` / `PPMGRPOTrainer`):

1. Profile the warm start per horizon and pick three: `easy` and `cliff` by the rule of `ppm_trl.demo.horizons`
   (the cliff: base all-correct low but non-zero, every line learnable, monotone) and `impossible` (the smallest n
   with base 0 beyond the cliff); or pass `--horizons`.
2. Tune: at the cliff (or `--tune-at impossible`), seed 0, every variant at every learning rate of `--lrs`; each
   variant keeps its best (final all-correct, ties broken by per-sub-problem accuracy). An unfair learning rate can
   fake a gap.
3. Run every horizon × variant × seed at the variant's best learning rate, same sample budget.
4. Optionally (`--extra-variants papo arg`) run PAPO / ARG at the largest horizon, same budget; or name them (and
   the composed `ppm+arg`, `papo+arg`) in `--variants` to tune them like the others.

Reported: final all-correct and per-sub-problem accuracy (mean ± sample std over seeds), the samples each needs
to reach `--target` all-correct (median over the seeds that reach it, and how many do), the fraction of rows the
zero-advantage filter removed (PPM variants) and of groups whose outcome rewards were all equal (every variant),
each line's accuracy at the start and the end, markdown tables and a plot. Runs are cached as JSON under
`--output-dir/runs/`, so an interrupted invocation resumes where it stopped.

    python benchmarks/horizon_scaling.py                    # ~1 h on 2 CPU cores
    python benchmarks/horizon_scaling.py --quick            # CI smoke (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict

from common import RESULTS, cached_run, markdown_table, mean_spread, samples_to_target

from ppm_trl.demo import VARIANT_LABELS, RunSpec, profile_warm_start, train_variant
from ppm_trl.demo import choose_horizons as cliff_rule
from ppm_trl.demo.kernels import pin_kernels
from ppm_trl.demo.warmstart import WarmStartSettings, read_manifest, warm_start
from ppm_trl.envs import make_dataset

ENVS = ("multi_add", "chain_add")  # independent and sequential reasoning graphs (PPM §5.1, App. A)


def choose_horizons(model_path: str, env: str, candidates: list[int], eval_size: int) -> tuple[dict[str, int], dict]:
    """{easy, cliff, impossible} horizons from the warm start's profile (`ppm_trl.demo.horizons`' rule for the
    cliff and the easy horizon; impossible: the smallest n beyond the cliff with base 0)."""
    rates = profile_warm_start(model_path, env, candidates, eval_size)
    chosen, _ = cliff_rule(rates)
    cliff = chosen["cliff"] or max(candidates)
    easy = chosen["easy"] or min(candidates)
    impossible = min((n for n in candidates if rates[n]["all_correct"] == 0 and n > cliff), default=max(candidates))
    return {"easy": easy, "cliff": cliff, "impossible": impossible}, rates


def run(args, model_path: str, variant: str, n: int, lr: float, seed: int, eval_sets: dict) -> dict | None:
    spec = RunSpec(variant=variant, n=n, learning_rate=lr, max_steps=args.steps, eval_every=args.eval_every,
                   seed=seed)
    path = os.path.join(args.output_dir, "runs", f"{variant}_n{n}_lr{lr:g}_s{seed}.json")
    if args.summarize_only and not os.path.exists(path):
        return None

    def compute():
        started = time.time()
        with tempfile.TemporaryDirectory() as scratch:  # the trainer's output_dir: nothing worth keeping is saved
            result = train_variant(model_path, spec, eval_sets[n], scratch, progress=not args.no_progress)
        print(f"  {variant:>10} n={n:<2} lr={lr:<7g} seed={seed}: all-correct "
              f"{result['history'][0]['all_correct']:.3f} → {result['history'][-1]['all_correct']:.3f}, per-sub "
              f"{result['history'][0]['per_subproblem']:.3f} → {result['history'][-1]['per_subproblem']:.3f} "
              f"({time.time() - started:.0f}s)", flush=True)
        return result

    result = cached_run(path, compute)
    stored, asked = (json.loads(json.dumps(s)) for s in (result["spec"], asdict(spec)))  # compared as JSON stores them
    stale = {k: (v, asked.get(k)) for k, v in stored.items() if asked.get(k) != v}
    if stale:  # e.g. the same run name with another --steps or --eval-every
        raise ValueError(f"cached run {path} was made with other settings (cached, asked): {stale}; delete it or "
                         f"use another --output-dir")
    return result


def check_warm_start(output_dir: str, model_path: str) -> None:
    """Runs in `output_dir` must all come from one warm start: record it on first use, refuse another later."""
    marker, key = os.path.join(output_dir, "warm_start.txt"), os.path.basename(os.path.normpath(model_path))
    if os.path.exists(marker):
        with open(marker) as handle:
            recorded = handle.read().strip()
        if recorded != key:
            raise ValueError(f"the runs in {output_dir} were made from warm start {recorded}, this invocation uses "
                             f"{key} ({model_path}); use another --output-dir")
        return
    os.makedirs(output_dir, exist_ok=True)
    with open(marker, "w") as handle:
        handle.write(key + "\n")


def final(result: dict, key: str) -> float:
    return result["history"][-1][key]


def train_metric(results: list[dict], name: str) -> str:
    """Mean over the seeds of the run-average of a logged training metric; "–" if the runs did not log it."""
    per_run = [[log[name] for log in r.get("train_logs", []) if name in log] for r in results]
    if not all(per_run):
        return "–"
    return f"{statistics.fmean(statistics.fmean(values) for values in per_run):.3f}"


def summarize(args, horizons: dict, rates: dict, best_lr: dict, tuning: dict, runs: dict) -> dict:
    """Per (horizon, variant): final metrics mean ± std, samples-to-target; plus the markdown tables."""
    rows, summary = [], {}
    for label, n in horizons.items():
        for variant in [v for v in VARIANT_LABELS if (n, v) in runs]:
            results = runs[(n, variant)]
            ac = mean_spread([final(r, "all_correct") for r in results])
            ps = mean_spread([final(r, "per_subproblem") for r in results])
            reached = [s for s in (samples_to_target(r["history"], args.target) for r in results) if s is not None]
            median = statistics.median(reached) if reached else None
            summary[f"{n}/{variant}"] = {"all_correct": ac, "per_subproblem": ps, "samples_to_target": median,
                                         "seeds_reaching_target": len(reached), "seeds": len(results),
                                         "lr": results[0]["spec"]["learning_rate"]}
            base = rates.get(n, {})
            rows.append([f"{n} ({label})", f"{base.get('all_correct', float('nan')):.3f} / "
                         f"{base.get('per_subproblem', float('nan')):.3f}", VARIANT_LABELS[variant],
                         f"{results[0]['spec']['learning_rate']:g}", f"{ac[0]:.3f} ± {ac[1]:.3f}",
                         f"{ps[0]:.3f} ± {ps[1]:.3f}",
                         f"{median:.0f} ({len(reached)}/{len(results)})" if median is not None
                         else f"not reached (0/{len(results)})",
                         train_metric(results, "ppm/frac_rows_filtered"), train_metric(results, "frac_reward_zero_std")])
    table = markdown_table(["n", "warm start all-correct / per-sub", "variant", "lr", "final all-correct",
                            "final per-sub-problem", f"samples to {args.target:g} all-correct (seeds)",
                            "frac_rows_filtered", "groups with equal outcomes"], rows)
    line_rows = []  # which lines each variant learned: final per-line accuracy at every horizon, mean over seeds
    for label, n in horizons.items():
        for variant in [v for v in VARIANT_LABELS if (n, v) in runs]:
            results = runs[(n, variant)]
            if all("per_point" in r["history"][-1] for r in results):
                start = results[0]["history"][0]["per_point"]
                lines = [statistics.fmean(values) for values in zip(*(r["history"][-1]["per_point"] for r in results))]
                line_rows.append([f"{n} ({label})", VARIANT_LABELS[variant], " ".join(f"{a:.2f}" for a in start),
                                  " ".join(f"{a:.2f}" for a in lines)])
    line_table = markdown_table(["n", "variant", "line accuracy at step 0", "line accuracy, final (mean of seeds)"],
                                line_rows)
    tune_rows = [[VARIANT_LABELS[v], f"{lr:g}", f"{final(r, 'all_correct'):.3f}", f"{final(r, 'per_subproblem'):.3f}",
                  "best" if best_lr.get(v) == lr else ""] for (v, lr), r in sorted(tuning.items())]
    tune_table = markdown_table(["variant", "lr", "final all-correct", "final per-sub", ""], tune_rows)
    return {"summary": summary, "table": table, "tuning_table": tune_table, "line_table": line_table}


def plot(args, horizons: dict, runs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = {label: n for label, n in horizons.items() if any(key[0] == n for key in runs)} or horizons  # --only
    fig, axes = plt.subplots(2, len(horizons), figsize=(4.2 * len(horizons), 7), squeeze=False)
    for column, (label, n) in enumerate(horizons.items()):
        for variant in [v for v in VARIANT_LABELS if (n, v) in runs]:
            results = runs[(n, variant)]
            samples = [h["samples"] for h in results[0]["history"]]
            for row, key in enumerate(("all_correct", "per_subproblem")):
                curves = [[h[key] for h in r["history"]] for r in results]
                stats = [mean_spread(list(values)) for values in zip(*curves)]
                mean = [m for m, _ in stats]
                ax = axes[row, column]
                ax.plot(samples, mean, marker="o", markersize=3, label=f"{VARIANT_LABELS[variant]} ({len(results)})")
                ax.fill_between(samples, [m - s for m, s in stats], [m + s for m, s in stats], alpha=0.15)
        axes[0, column].set_title(f"{args.env} n={n} ({label})")
        axes[0, column].axhline(args.target, color="gray", lw=0.6, ls=":")
        for row, ylabel in enumerate(("all-correct (sampled)", "per-sub-problem accuracy")):
            axes[row, column].set_xlabel("training samples")
            axes[row, column].set_ylabel(ylabel)
            axes[row, column].grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    axes[1, -1].legend(fontsize=7)  # the largest n may add PAPO / ARG
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Sparse vs trajectory vs segment PPM across horizons (PPM Fig. 4)")
    parser.add_argument("--env", choices=ENVS, default="multi_add",
                        help="multi_add: independent sub-problems; chain_add: sequential (each needs the last).")
    parser.add_argument("--horizons", type=int, nargs=3, default=None, metavar=("EASY", "CLIFF", "IMPOSSIBLE"))
    parser.add_argument("--candidates", type=int, nargs="+", default=[2, 3, 4, 5, 6, 8, 10, 12, 14, 16])
    parser.add_argument("--variants", nargs="+", default=["sparse", "trajectory", "segment"])
    parser.add_argument("--extra-variants", nargs="*", default=[], help="e.g. papo arg: run at the largest n.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--steps", type=int, default=60, help="RL steps per run (64 samples each).")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=128)
    parser.add_argument("--target", type=float, default=0.10)
    parser.add_argument("--output-dir", default=None, help="Default benchmarks/results/horizon_scaling/<env>.")
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache root.")
    parser.add_argument("--warm-start-steps", type=int, default=None,
                        help="Train the warm start this many SFT steps (default: the recipe's fixed count).")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--best-lrs", nargs="+", default=None, metavar="VARIANT=LR",
                        help="Skip the tuning and use these learning rates (e.g. the ones tuned on multi_add).")
    parser.add_argument("--tune-at", choices=["cliff", "impossible"], default="cliff",
                        help="The horizon whose seed-0 runs pick each variant's learning rate.")
    parser.add_argument("--only", nargs="+", choices=["easy", "cliff", "impossible"],
                        default=["cliff", "impossible", "easy"], help="Which horizons to run.")
    parser.add_argument("--extras-only", action="store_true",
                        help="Only the --extra-variants runs (tuning read from the cached runs): a second process "
                        "can share the work with the one running the main grid.")
    parser.add_argument("--summarize-only", action="store_true",
                        help="Tables and plot from the runs cached so far; train nothing (partial results).")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny warm start, 2 steps, 1 seed, 1 lr.")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    args.output_dir = args.output_dir or os.path.join(RESULTS, "horizon_scaling", args.env)
    settings = WarmStartSettings.for_env(args.env)
    if args.warm_start_steps is not None:
        settings = WarmStartSettings.for_env(args.env, max_steps=args.warm_start_steps)
    if args.quick:
        settings = WarmStartSettings(env=args.env, horizons=(1, 2), num_examples=64, max_steps=2, batch_size=8, hidden_size=32,
                                     num_hidden_layers=1)
        args.horizons, args.seeds, args.lrs, args.steps, args.eval_every, args.eval_size = [1, 2, 3], [0], [1e-4], 2, 1, 8
        args.output_dir = args.output_dir + "_quick"
    started = time.time()
    model_path = warm_start(settings, cache_root=args.cache_dir, progress=not args.no_progress)
    check_warm_start(args.output_dir, model_path)
    if args.horizons:
        horizons = dict(zip(("easy", "cliff", "impossible"), args.horizons))
        rates = profile_warm_start(model_path, args.env, args.horizons, args.eval_size)
    else:
        horizons, rates = choose_horizons(model_path, args.env, args.candidates, args.eval_size)
    print(f"horizons {horizons}", flush=True)
    eval_sets = {n: make_dataset(args.env, n, args.eval_size, seed=90_000 + n) for n in horizons.values()}

    tuning, best_lr = {}, {}
    if args.best_lrs:
        best_lr = {v: float(lr) for v, lr in (item.split("=") for item in args.best_lrs)}
    for variant in args.variants if not args.best_lrs else ():
        for lr in args.lrs:
            result = run(args, model_path, variant, horizons[args.tune_at], lr, args.seeds[0], eval_sets)
            if result is not None:
                tuning[(variant, lr)] = result
        tried = [lr for lr in args.lrs if (variant, lr) in tuning]
        if tried:
            best_lr[variant] = max(tried, key=lambda lr, v=variant: (final(tuning[(v, lr)], "all_correct"),
                                                                   final(tuning[(v, lr)], "per_subproblem")))
    print(f"best learning rates at the {args.tune_at}: {best_lr}", flush=True)

    runs: dict = {}
    for label in args.only if not args.extras_only else ():
        n = horizons[label]
        for variant in [v for v in args.variants if v in best_lr]:
            done = [run(args, model_path, variant, n, best_lr[variant], seed, eval_sets) for seed in args.seeds]
            if any(r is not None for r in done):
                runs[(n, variant)] = [r for r in done if r is not None]
    largest = max(horizons.values())
    for variant in args.extra_variants:
        try:
            done = [run(args, model_path, variant, largest, best_lr.get("sparse", args.lrs[0]), seed, eval_sets)
                    for seed in args.seeds]
        except (ImportError, AttributeError, TypeError, ValueError, NotImplementedError) as error:
            print(f"  {variant}: skipped ({type(error).__name__}: {error})", flush=True)  # trainer missing or broken
            continue
        if any(r is not None for r in done):
            runs[(largest, variant)] = [r for r in done if r is not None]

    report = summarize(args, horizons, rates, best_lr, tuning, runs)
    plot_path = os.path.join(args.output_dir, "horizon_scaling.png")
    plot(args, horizons, runs, plot_path)
    report.update({"horizons": horizons, "base_rates": {str(k): v for k, v in rates.items()}, "best_lr": best_lr,
                   "settings": vars(args), "warm_start": model_path, "plot": plot_path,
                   "warm_start_fingerprint": read_manifest(model_path)["weights_digest"],
                   "wall_seconds": time.time() - started})
    with open(os.path.join(args.output_dir, "summary.json"), "w") as handle:
        json.dump(report, handle, indent=2, default=str)
    print("\n" + report["tuning_table"] + "\n\n" + report["table"] + "\n\n" + report["line_table"], flush=True)
    return report


if __name__ == "__main__":
    pin_kernels()  # re-executes with the pinned kernels (ppm_trl.demo.kernels)
    main()
