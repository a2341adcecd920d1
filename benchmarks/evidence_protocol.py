"""The protocol every part of `evidence.py` shares: cached runs, tuning and reporting prompts, lr grids, warm starts.

Every run is one `ppm_trl.demo.train_variant` on one thread, cached as JSON under `<output-dir>/runs/<task>/` (so
the suite runs in pieces, across sessions and machines). Tuning runs (the tuning seeds) are evaluated on tuning
prompts, reporting runs on held-out prompts disjoint from them.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict

from common import markdown_table
from evidence_stats import rate_interval, tuning_noise

from ppm_trl.demo import VARIANT_LABELS, RunSpec, format_profile, profile_warm_start, train_variant
from ppm_trl.demo.warmstart import WarmStartSettings, read_manifest, warm_start
from ppm_trl.envs import make_dataset


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
    """mean [low, high] of rates (t interval clipped to [0, 1])."""
    return _fmt_mean_interval(*rate_interval(values))


def fmt_gap(gap: dict) -> str:
    """mean [low, high] of a `paired_gap`."""
    return _fmt_mean_interval(gap["mean"], gap["ci95"])


def _fmt_mean_interval(mean: float, interval: list[float] | None) -> str:
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
        return os.path.join(
            self.args.output_dir,
            "runs",
            self.folder,
            f"{spec.variant}_n{spec.n}_lr{spec.learning_rate:g}_s{spec.seed}_{spec.max_steps}st.json",
        )

    def run(self, specs: list[RunSpec]) -> dict[tuple, dict]:
        """{(variant, n, lr, seed): result} of `specs` that are cached or trained now (`--plan`: cached only)."""
        results, todo = {}, []
        for spec in specs:
            key, path = (spec.variant, spec.n, spec.learning_rate, spec.seed), self.path(spec)
            if os.path.exists(path):
                with open(path) as handle:
                    results[key] = json.load(handle)
                check_cached_spec(path, results[key]["spec"], spec)
            else:
                todo.append((key, spec, path))
        if not todo:
            return results
        if self.args.plan_only:
            missing = (os.path.relpath(path, self.args.output_dir) for _, _, path in todo)
            PENDING.extend(path for path in missing if path not in PENDING)
            return results
        print(f"  {self.env}: {len(todo)} run(s) to train, {self.args.workers} at a time", flush=True)
        jobs = [
            (self.model_path, self.env, spec, self.args.eval_size, self.role(spec.seed), path) for _, spec, path in todo
        ]
        if self.args.workers == 1:
            for (key, *_), job in zip(todo, jobs):
                results[key] = _run_job(*job)
                report(key, results[key])
            return results
        from concurrent.futures import as_completed

        pool = worker_pool(self.args.workers)
        futures = {pool.submit(_run_job, *job): key for (key, *_), job in zip(todo, jobs)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            report(futures[future], results[futures[future]])
        return results


_POOLS: dict = {}


def worker_pool(workers: int):
    """One pool of `workers` spawned processes for the whole invocation: a pool per batch of runs started fresh
    interpreters, whose imports cost ~4 s per worker per batch (a run's own work needs nothing of an earlier run)."""
    if workers not in _POOLS:
        import atexit
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        _POOLS[workers] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_POOLS[workers].shutdown)
    return _POOLS[workers]


def report(key: tuple, result: dict) -> None:
    first, last = result["history"][0], result["history"][-1]
    print(
        f"    {key[0]:>20} n={key[1]} lr={key[2]:g} seed={key[3]}: all-correct {first['all_correct']:.3f} → "
        f"{last['all_correct']:.3f}, greedy {first['greedy_all_correct']:.3f} → {last['greedy_all_correct']:.3f}, "
        f"per-sub {first['per_subproblem']:.3f} → {last['per_subproblem']:.3f} ({result['wall_seconds']:.0f}s)",
        flush=True,
    )


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
        harder = {m: eval_set(env, m, role, eval_size) for m in spec.harder_horizons}
        result = train_variant(model_path, spec, eval_set(env, spec.n, role, eval_size), scratch, progress=False,
                               harder_eval_sets=harder)
    result.update(wall_seconds=time.time() - started, eval_role=role, env=env)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(path + ".tmp", path)
    return result


def spec(args, variant: str, n: int, lr: float, seed: int, steps: int, pass_k: int = 0,
         harder: tuple[int, ...] = ()) -> RunSpec:
    """One run of the protocol: `args`' evaluation interval and batch (prompts per step × G)."""
    return RunSpec(variant=variant, n=n, learning_rate=lr, max_steps=steps, eval_every=args.eval_every, seed=seed,
                   prompts_per_step=args.prompts_per_step, num_generations=args.num_generations, pass_k=pass_k,
                   harder_horizons=harder)


def samples_per_step(args) -> int:
    return args.prompts_per_step * args.num_generations


def check_cached_spec(path: str, stored: dict, wanted: RunSpec) -> None:
    """A cached run is reused only for the spec it was trained with (a field it predates counts at its default)."""
    have = json.loads(json.dumps({**asdict(RunSpec()), **stored}))
    want = json.loads(json.dumps(asdict(wanted)))
    differ = {key: (have.get(key), value) for key, value in want.items() if have.get(key) != value}
    if differ:
        raise SystemExit(f"{path} was trained with other settings than this invocation asks for "
                         f"(field: (cached, asked)): {differ}; use another --output-dir or delete the file")


def outcome_score(result: dict) -> tuple[float, float]:
    """What a variant is tuned for: final all-correct at T = 1, ties broken by per-sub-problem accuracy."""
    return final(result), final(result, "per_subproblem")


def own_reward_score(result: dict, reward: str = "shown_work_reward") -> tuple[float, float]:
    """A PRM-only arm is tuned for what it optimises, its own reward `reward` (last logging window): an arm tuned for
    the accuracy it is meant to show losing would be tuned not to train (the grid table shows its accuracy at every
    lr)."""
    return logged_series(result, f"rewards/{reward}/mean")[-1][1], final(result)


def tune(args, runner: Runner, variants: list[str], n: int, steps: int, scores: dict | None = None) -> dict:
    """Each variant's best lr at horizon n over the tuning seeds, extending a grid whose best is at an edge.

    Returns {variant: {"best": lr | None, "grid": {lr: {"per_seed": [...], "mean": ..., "per_sub": ...}},
    "at_edge": bool, "noise": `tuning_noise` of the grid}}; "best" is None while a grid cell is not trained (`--plan`). The grids of all variants are
    trained together, one extension round at a time. `scores[variant]` (default `outcome_score`) ranks a run."""
    scores = scores or {}
    grids = {variant: sorted(args.lrs) for variant in variants}
    out, open_ = {}, list(variants)
    for _ in range(args.max_extensions + 1):
        runs = runner.run(
            [spec(args, v, n, lr, s, steps) for v in open_ for lr in grids[v] for s in args.tuning_seeds]
        )
        still_open = []
        for variant in open_:
            lrs, grid = grids[variant], {}
            for lr in lrs:
                cell = [runs[(variant, n, lr, s)] for s in args.tuning_seeds if (variant, n, lr, s) in runs]
                if len(cell) == len(args.tuning_seeds):
                    ranked = [scores.get(variant, outcome_score)(r) for r in cell]
                    grid[lr] = {
                        "per_seed": [final(r) for r in cell],
                        "mean": statistics.fmean(final(r) for r in cell),
                        "per_sub": statistics.fmean(final(r, "per_subproblem") for r in cell),
                        "score": [statistics.fmean(column) for column in zip(*ranked)],
                    }
            if len(grid) < len(lrs):
                out[variant] = {"best": None, "grid": grid, "at_edge": None}
                continue
            best = max(lrs, key=lambda lr: grid[lr]["score"])
            out[variant] = {
                "best": best,
                "grid": grid,
                "at_edge": best in (lrs[0], lrs[-1]),
                "noise": tuning_noise(grid, args.eval_size),
            }
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
    """One row per (variant, lr); the best row says whether it beats the runner-up beyond noise (`tuning_noise`)."""
    rows = []
    for variant, info in tuned.items():
        for lr, cell in sorted(info["grid"].items()):
            rows.append(
                [
                    VARIANT_LABELS[variant],
                    f"{lr:g}",
                    " ".join(f"{v:.3f}" for v in cell["per_seed"]),
                    f"{cell['mean']:.3f}",
                    f"{cell['per_sub']:.3f}",
                    f"{cell['score'][0]:.3f}",
                    best_note(info) if lr == info["best"] else "",
                ]
            )
    return f"### {title} (n = {n}; tuning seeds, tuning prompts; final all-correct at T = 1)\n\n" + markdown_table(
        ["variant", "lr", "final all-correct per tuning seed", "mean", "mean per-sub-problem", "ranked by", ""], rows
    )


def best_note(info: dict) -> str:
    noise = info.get("noise") or {}
    note = "best" + (" (edge)" if info["at_edge"] else "")
    if noise.get("difference") is not None:
        verdict = "inside noise" if noise["inside_noise"] else "beyond noise"
        note += f"; vs {noise['runner_up']:g}: {noise['difference']:+.3f}, SE {noise['se']:.3f} ({verdict})"
    return note


def pinned_warm_start(
    args, env: str, horizons: list[int], label: str = "", profile_only: bool = False, **overrides
) -> tuple[str, str, dict]:
    """(path, fingerprint, profile by n) of `env`'s recipe warm start (with `overrides`, whose profile file carries
    `label`); the profile is cached next to the runs. `profile_only`: a stored profile is enough (path ""), as under
    --plan; the warm start is built only when no profile of it is stored."""
    settings = WarmStartSettings.for_env(env, **overrides)
    if args.quick:
        settings = WarmStartSettings(
            env=env, horizons=(1, 2), num_examples=64, max_steps=2, batch_size=8, hidden_size=32, num_hidden_layers=1
        )
    profile_file = os.path.join(args.output_dir, f"profile_{env}{label}.json")
    stored = None
    if os.path.exists(profile_file):
        with open(profile_file) as handle:
            stored = json.load(handle)
        if (args.plan_only or profile_only) and all(str(n) in stored["profile"] for n in horizons):
            # --plan / --summarize-only read the runs of the warm start they were measured on; nothing is built
            # (runs measured under other kernels stay readable).
            profile = {int(n): v for n, v in stored["profile"].items()}
            print(
                f"{env}: warm start {stored['fingerprint']} (as stored; not rebuilt)\n"
                f"{format_profile({n: profile[n] for n in horizons})}",
                flush=True,
            )
            return "", stored["fingerprint"], profile
    path = warm_start(settings, cache_root=args.cache_dir, progress=False)
    fingerprint = read_manifest(path)["weights_digest"]
    profile = {}
    if stored is not None:
        if stored["fingerprint"] != fingerprint:
            raise SystemExit(
                f"{args.output_dir} holds runs of warm start {stored['fingerprint']} for {env}; this "
                f"machine built {fingerprint}. Use another --output-dir (or delete the old runs)."
            )
        profile = {int(n): v for n, v in stored["profile"].items()}
    missing = [n for n in horizons if n not in profile]
    if missing:
        profile.update(profile_warm_start(path, env, missing, args.profile_size))
        os.makedirs(args.output_dir, exist_ok=True)
        with open(profile_file, "w") as handle:
            json.dump(
                {
                    "fingerprint": fingerprint,
                    "settings": asdict(settings),
                    "profile": {str(n): profile[n] for n in sorted(profile)},
                },
                handle,
                indent=2,
            )
    print(f"{env}: warm start {fingerprint} ({path})\n{format_profile({n: profile[n] for n in horizons})}", flush=True)
    return path, fingerprint, profile


def save_figure(fig, axes, titles, xlabel: str, path: str | None) -> None:
    """Title, label and grid each panel, legend the first, write `path` (None: one row of several; the caller
    writes the figure)."""
    import matplotlib.pyplot as plt

    for ax, title in zip(axes, titles):
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if path is None:
        return
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
