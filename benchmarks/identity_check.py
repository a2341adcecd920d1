"""Bit-identity check for refactors: the same training runs before and after a change must give the same weights and
the same logged numbers.

    OMP_NUM_THREADS=1 python benchmarks/identity_check.py --json before.json          # on the tree before the change
    OMP_NUM_THREADS=1 python benchmarks/identity_check.py --json after.json --compare before.json

`benchmarks/results/identity_check_before_issue31.json` is the record of the tree before issue 31's restructure
(`--demo` included), on this repository's locked versions (constraints/tested.txt) and CPU.

Each case is one `ppm-trl train` run (2 optimizer steps, seed 0, CPU, one thread, its own process) through the
public CLI (`ppm_trl.cli.main`), so the flags and YAML keys are exercised as a user gives them; the record is the sha256 of the saved
`model.safetensors` and of the run's `log_history` without its wall-clock entries (runtime, samples per second,
step time). Cases that need a model which solves some problems (so that advantages are non-zero and the weights
move) start from the cached warm starts of `ppm_trl.demo.warmstart` (multi_add's is `make demo`'s; each is built in
~8 min of one core when not cached); the guidance cases start from the untrained tiny model, whose groups all fail, so every group is guided.
`--cases` picks some. `--demo` adds `python -m ppm_trl.demo --quick` with a fresh warm-start cache: its stdout with
durations removed, its results.json (durations removed) and its PPM checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TIMING_KEYS = re.compile(r"runtime|per_second|step_time|_time$|time/")
DEMO_TIMING_KEYS = re.compile(r"runtime|per_second|seconds|step_time|_time$|time/")  # the demo's results.json

# (name, what it starts from, flags): a YAML config under configs/, or "warm:<env>" for the warm start of that env
# (`make demo`'s is multi_add's).
WARM = ["--env_size", "32", "--use_cpu", "true", "--bf16", "false",
        "--gradient_checkpointing", "false", "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--max_completion_length", "96", "--max_steps", "2", "--logging_steps", "1", "--save_strategy", "no",
        "--report_to", "none", "--seed", "0", "--learning_rate", "1e-4", "--warmup_steps", "0"]
ARG_FLAGS = ["--arg_num_continuations", "4", "--arg_max_accepted", "2", "--arg_min_continuation_tokens", "16"]
CASES = [
    ("grpo_warm", "warm:multi_add", ["--method", "grpo", "--env_n", "1"]),
    ("ppm_equal_chunks", "warm:multi_add", ["--method", "ppm", "--env_n", "3", "--num_segments", "4"]),
    ("ppm_delimiter", "warm:multi_add", ["--method", "ppm", "--env_n", "3", "--num_segments", "4", "--segmentation",
                                         "delimiter"]),
    ("ppm_trajectory", "warm:multi_add", ["--method", "ppm", "--env_n", "3", "--granularity", "trajectory"]),
    ("ppm_exact_order", "warm:multi_add", ["--method", "ppm", "--env_n", "3", "--progress_mode", "exact_order"]),
    ("ppm_process_reward", "warm:multi_add", ["--method", "ppm", "--env_n", "3", "--progress_mode", "process_reward",
                                  "--scale_rewards", "group", "--overlap_scoring", "false"]),
    ("papo", "warm:multi_add", ["--method", "papo", "--env_n", "1"]),
    ("papo_full_mult", "warm:multi_add", ["--method", "papo", "--env_n", "1", "--process_norm", "full", "--combine",
                              "multiplicative", "--overlap_scoring", "false"]),
    ("papo_full", "warm:multi_add", ["--method", "papo", "--env_n", "2", "--process_norm", "full", "--process_weight",
                                     "0.5"]),
    ("arg_warm", "warm:multi_add", ["--method", "arg", "--env_n", "3", *ARG_FLAGS]),
    ("ppm_arg_warm", "warm:multi_add", ["--method", "ppm+arg", "--env_n", "3", "--segmentation", "delimiter",
                                        *ARG_FLAGS]),
    ("papo_arg_warm", "warm:multi_add", ["--method", "papo+arg", "--env_n", "2", *ARG_FLAGS]),
    # multi_add_boxed: the outcome is the box, so correct answers differ in their work lines and A_proc is not 0.
    ("papo_boxed", "warm:multi_add_boxed", ["--method", "papo", "--env_n", "3"]),
    ("papo_boxed_full", "warm:multi_add_boxed", ["--method", "papo", "--env_n", "3", "--process_norm", "full",
                                                 "--overlap_scoring", "false"]),
    ("papo_boxed_mult", "warm:multi_add_boxed", ["--method", "papo", "--env_n", "3", "--combine", "multiplicative"]),
    ("papo_arg_boxed", "warm:multi_add_boxed", ["--method", "papo+arg", "--env_n", "4", *ARG_FLAGS]),
    ("arg_tiny", "arg_tiny.yaml", []),
    ("arg_tiny_resampling", "arg_tiny.yaml", ["--arg_mode", "resampling"]),
    ("arg_tiny_insertion", "arg_tiny.yaml", ["--arg_mode", "reference_insertion", "--surprisal_weighting", "false"]),
    ("ppm_arg_tiny", "ppm_arg_tiny.yaml", []),
    ("papo_arg_tiny", "papo_arg_tiny.yaml", []),
    ("ppm_tiny_multiturn", "ppm_tiny_multiturn.yaml", []),
]


def sha256_file(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def sha256_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def without_timings(log_history: list[dict]) -> list[dict]:
    return [{key: value for key, value in entry.items() if not TIMING_KEYS.search(key)} for entry in log_history]


def run_case(name: str, output_dir: str) -> dict:
    """Train one case in this process (called in a child process) with `ppm-trl train`, and return its record."""
    import transformers

    from ppm_trl import cli

    _, start, flags = next(case for case in CASES if case[0] == name)
    if start.startswith("warm:"):
        from ppm_trl.demo.warmstart import WarmStartSettings, warm_start

        env = start.split(":", 1)[1]
        argv = ["--model_name_or_path", warm_start(WarmStartSettings(env=env)), "--env_name", env, *WARM, *flags]
    else:
        argv = ["--config", os.path.join(ROOT, "configs", start), *flags]
    # The command's own trainer, whatever builds it: its log history is read when `Trainer.train` returns.
    histories, train = [], transformers.Trainer.train

    def recording_train(self, *args, **kwargs):
        result = train(self, *args, **kwargs)
        histories.append(self.state.log_history)
        return result

    transformers.Trainer.train = recording_train
    cli.main(["train", *argv, "--output_dir", output_dir])
    history = without_timings(histories[-1])
    return {"weights": sha256_file(os.path.join(output_dir, "model.safetensors")), "log_history": sha256_json(history),
            "final_log": history[-2] if len(history) > 1 else history[-1]}


def run_demo(work: str) -> dict:
    """`python -m ppm_trl.demo --quick` with a fresh warm-start cache: its numbers, durations removed."""
    out, cache = os.path.join(work, "demo"), os.path.join(work, "cache")
    process = subprocess.run([sys.executable, "-m", "ppm_trl.demo", "--quick", "--output_dir", out, "--cache_dir",
                              cache, "--workers", "1"], cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": ROOT})
    if process.returncode:
        raise RuntimeError(f"demo failed:\n{process.stderr[-4000:]}")
    stdout = process.stdout.replace(work, "<work>")
    stdout = re.sub(r"\(\d+s\)|\d+(\.\d+)?\s?(s|min)\b", "<time>", stdout)
    stdout = re.sub(r"'(train_runtime|train_samples_per_second|train_steps_per_second)': '[^']*'", r"'\1': <time>",
                    stdout)
    with open(os.path.join(out, "results.json")) as handle:
        results = json.load(handle)

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not DEMO_TIMING_KEYS.search(k)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value.replace(work, "<work>") if isinstance(value, str) else value

    weights = os.path.join(out, "ppm_model", "model.safetensors")
    return {"stdout": sha256_json(stdout), "stdout_text": stdout, "results": sha256_json(strip(results)),
            "results_json": strip(results),
            "weights": sha256_file(weights) if os.path.exists(weights) else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--compare", help="a record to compare with; exit status 1 on any difference")
    parser.add_argument("--cases", nargs="*", default=[case[0] for case in CASES])
    parser.add_argument("--demo", action="store_true", help="also run the quick demo")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # child process: train this case
    parser.add_argument("--output_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print("RECORD " + json.dumps(run_case(args.case, args.output_dir)), flush=True)
        return
    record = {}
    with tempfile.TemporaryDirectory() as work:
        for name in args.cases:
            process = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", name, "--output_dir",
                                      os.path.join(work, name)], cwd=ROOT, capture_output=True, text=True,
                                     env={**os.environ, "PYTHONPATH": ROOT})
            lines = [line for line in process.stdout.splitlines() if line.startswith("RECORD ")]
            if process.returncode or not lines:
                raise RuntimeError(f"case {name} failed:\n{process.stderr[-4000:]}")
            record[name] = json.loads(lines[-1][len("RECORD "):])
            print(f"{name:22s} weights {record[name]['weights'][:16]}  log {record[name]['log_history'][:16]}",
                  flush=True)
        if args.demo:
            record["demo"] = run_demo(work)
            print(f"{'demo --quick':22s} weights {str(record['demo']['weights'])[:16]}  results "
                  f"{record['demo']['results'][:16]}  stdout {record['demo']['stdout'][:16]}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as handle:
            before = json.load(handle)
        differences = [name for name in record if name in before and
                       any(record[name].get(k) != before[name].get(k) for k in ("weights", "log_history", "results",
                                                                                 "stdout"))]
        missing = [name for name in record if name not in before]
        print(f"identical: {len(record) - len(differences) - len(missing)} of {len(record)}; different: "
              f"{differences or 'none'}; not in {args.compare}: {missing or 'none'}")
        if differences:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
