"""Retrain cached evidence runs from scratch and check that every number comes out the same.

    python benchmarks/evidence_rerun.py runs/multi_add/lines_n2_lr0.0001_s0_100st.json \
        runs/multi_add_any_order/arg_n3_lr0.0001_s0_60st.json --workers 2

Each named run file (relative to `--results-dir`) is trained again under the spec it records, from a warm start that
this invocation builds in a fresh cache (`--cache-dir`, default a new temporary directory, so nothing a previous
session left behind is reused) with the settings the runs' folder recorded (`runs/<folder>/` ↔
`profile_<folder>.json`: `chain_add_sft725` is `chain_add`'s SFT stopped at 725 steps); the warm start's fingerprint
must equal the one the runs were measured on. Then every number of the stored evaluation history and training logs must come out exactly
the same, timings aside (a measurement the code added after the run was stored is reported, not compared). Threads
are pinned to one per run, as the evidence runs were (`OMP_NUM_THREADS=1`): the float results depend on the thread
count. Exit status 1 if any number differs; a JSON report goes to `--report`.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # the evidence runs' setting; must precede torch's import

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from common import RESULTS  # noqa: E402
from evidence_protocol import _run_job  # noqa: E402

from ppm_trl.demo import RunSpec  # noqa: E402
from ppm_trl.demo.kernels import pin_kernels  # noqa: E402
from ppm_trl.demo.warmstart import WarmStartSettings, read_manifest, warm_start  # noqa: E402

TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="Run files, relative to --results-dir.")
    parser.add_argument("--results-dir", default=os.path.join(RESULTS, "evidence_v3"),
                        help="Where the runs are (evidence.py's --output-dir).")
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache (default: a fresh temporary directory).")
    parser.add_argument("--eval-size", type=int, default=256, help="As the evidence runs were made.")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--report", default=None, help="Where to write the JSON comparison.")
    return parser.parse_args(argv)


def without_timings(logs: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in logs]


def _entries(run: dict) -> dict[str, list[dict]]:
    return {"history": run["history"], "train_logs": without_timings(run["train_logs"])}


def differences(stored: dict, rerun: dict) -> list[str]:
    """Where the rerun's numbers differ from the stored run's (empty: identical). Every number the stored run has
    must come out the same; a measurement added to the code after the run was stored is not one (`added_keys`)."""
    found = []
    for key, old in _entries(stored).items():
        new = _entries(rerun)[key]
        if len(old) != len(new):
            found.append(f"{key}: {len(old)} entries stored, {len(new)} rerun")
            continue
        for i, (a, b) in enumerate(zip(old, new)):
            for name in sorted(a):
                if a[name] != b.get(name):
                    found.append(f"{key}[{i}].{name}: stored {a[name]!r}, rerun {b.get(name)!r}")
    return found


def added_keys(stored: dict, rerun: dict) -> list[str]:
    """`key.name` of what the rerun measures that the stored run has not (code newer than the run)."""
    return sorted({f"{key}.{name}" for key, old in _entries(stored).items()
                   for a, b in zip(old, _entries(rerun)[key]) for name in set(b) - set(a)})


def recorded_warm_start(results_dir: str, folder: str) -> tuple[WarmStartSettings, str]:
    """(settings, fingerprint) of the warm start the runs of `runs/<folder>/` were measured on (its profile file)."""
    with open(os.path.join(results_dir, f"profile_{folder}.json")) as handle:
        profile = json.load(handle)
    settings = {key: tuple(value) if isinstance(value, list) else value for key, value in profile["settings"].items()}
    return WarmStartSettings(**settings), profile["fingerprint"]


def run_folder(name: str) -> str:
    """`runs/<folder>/<file>.json` → folder (the warm start's profile is named after it)."""
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "runs":
        raise SystemExit(f"{name}: expected runs/<folder>/<file>.json")
    return parts[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="ppm_trl_rerun_cache_")
    stored = {}
    for name in args.runs:
        path = os.path.join(args.results_dir, name)
        if not os.path.isfile(path):
            raise SystemExit(f"{path}: no such run file")
        with open(path) as handle:
            stored[name] = json.load(handle)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    models, report = {}, {"commit": commit, "cache_dir": cache, "runs": {}, "warm_starts": {}}
    for folder in sorted({run_folder(name) for name in stored}):
        started = time.time()
        settings, expected = recorded_warm_start(args.results_dir, folder)
        path = warm_start(settings, cache_root=cache, progress=False)
        built = read_manifest(path)["weights_digest"]
        report["warm_starts"][folder] = {"built": built, "stored": expected, "seconds": round(time.time() - started)}
        print(f"{folder}: warm start {built} (runs measured on {expected}) in {time.time() - started:.0f}s", flush=True)
        if built != expected:
            raise SystemExit(f"{folder}: this machine built warm start {built}, the runs were measured on {expected}")
        models[folder] = path
    scratch = tempfile.mkdtemp(prefix="ppm_trl_rerun_runs_")
    jobs = {name: (models[run_folder(name)], run["env"], RunSpec(**run["spec"]), args.eval_size, run["eval_role"],
                   os.path.join(scratch, name.replace("/", "_"))) for name, run in stored.items()}
    reruns = {}
    if args.workers == 1:
        reruns = {name: _run_job(*job) for name, job in jobs.items()}
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {name: pool.submit(_run_job, *job) for name, job in jobs.items()}
            reruns = {name: future.result() for name, future in futures.items()}
    failed = False
    for name, rerun in reruns.items():
        found, added = differences(stored[name], rerun), added_keys(stored[name], rerun)
        failed |= bool(found)
        final = rerun["history"][-1]
        report["runs"][name] = {"identical": not found, "differences": found[:20],
                                "added_keys": added,
                                "final_all_correct": final["all_correct"],
                                "final_greedy_all_correct": final["greedy_all_correct"],
                                "wall_seconds": round(rerun["wall_seconds"])}
        verdict = "identical" if not found else f"{len(found)} numbers differ, first: {found[0]}"
        if added:
            verdict += f" (measured now, not when stored: {', '.join(added)})"
        print(f"{name}: final all-correct {final['all_correct']:.4f}, greedy {final['greedy_all_correct']:.4f} "
              f"({rerun['wall_seconds']:.0f}s) — {verdict}", flush=True)
    if args.report:
        with open(args.report, "w") as handle:
            json.dump(report, handle, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    pin_kernels()  # re-executes with the pinned kernels (ppm_trl.demo.kernels)
    sys.exit(main())
