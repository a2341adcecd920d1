"""A hosted judge's quota against 1, 2 and 4 training processes (issue 24 item 6), in ONE run.

A loopback judge server (tests/judge_server.py) enforces a quota of `--quota-rpm` requests per minute over a sliding
window (`--window` seconds, scaled down from a minute so that a CPU run fills many windows: a quota of 300 rpm with a
1 s window admits 5 requests in any second) and answers 429 with the Retry-After at which a slot frees beyond it.
For N ∈ {1, 2, 4}, `accelerate launch` (DDP on CPU, gloo) trains a PPM trainer (tiny model, real generation,
K = 4 segments, the LiteLLM judge over `openai_http`, no cache hits: every step's prefixes are new) for `--steps`
steps, twice: without a limit, and with `judge_max_rpm` = the quota (each process takes 1/N, burst one second).
Reported per run: the most requests the server saw in any window (the quota counts those) against quota and
quota + one burst, the mean rate over the run, the 429s, unscorable answers, and judge wait per step.

The limiter's cost when the quota does not bind: one process, a server without quota, `judge_max_rpm` far above
the load against no limit, steps alternating between the two trainers' runs; the ratio of mean step times.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/judge_quota.py [--processes 1 2 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy")

JUDGE_METRICS = ("calls", "throttled", "failures", "retries", "rate_limit_wait_s")


# ------------------------------------------------------------------------------------------------ worker
def worker(args) -> None:
    """One rank of one launch: train, then write this rank's step times and judge counters."""
    import torch
    from transformers import TrainerCallback

    from ppm_trl.envs import make_dataset
    from ppm_trl.ppm.ppm_config import PPMConfig
    from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(args.seed)

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.started = [], None

        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.started)

    model, tokenizer = build_tiny_model_and_tokenizer()
    dataset = make_dataset("multi_countdown", 64, 4, seed=args.seed)
    config = PPMConfig(
        output_dir=os.path.join(args.out, f"train.rank{rank}"), use_cpu=True,
        ddp_backend="gloo" if world > 1 else None, bf16=False, report_to="none", save_strategy="no",
        logging_steps=1, per_device_train_batch_size=4, num_generations=4, max_completion_length=32,
        num_segments=4, max_steps=args.steps, learning_rate=1e-6, filter_zero_advantage_groups=False,
        progress_scorer="judge", judge_model="openai/loopback-judge", judge_api_base=args.api_base,
        judge_transport="openai_http", judge_cache_dir=os.path.join(args.out, f"cache.{args.tag}"),
        judge_probe=False, judge_timeout=30, judge_num_retries=args.retries, judge_max_rpm=args.max_rpm,
        seed=args.seed,
    )
    timer = StepTimes()
    def no_outcome(completions, **_):  # the judged progress is the whole reward
        return [0.0] * len(completions)

    trainer = PPMGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=no_outcome, args=config,
                             train_dataset=dataset, callbacks=[timer])
    trainer.train()
    judged = [{k.removeprefix("judge/"): v for k, v in log.items() if k.startswith("judge/")}
              for log in trainer.state.log_history if "loss" in log]
    totals = {name: sum(step.get(name, 0.0) for step in judged) for name in JUDGE_METRICS}
    with open(os.path.join(args.out, f"{args.tag}.rank{rank}.json"), "w") as handle:
        json.dump({"step_s": timer.times, "judge": totals, "world": world}, handle)


# ------------------------------------------------------------------------------------------------ driver
def launch(tag: str, processes: int, api_base: str, out: str, steps: int, max_rpm: float | None, retries: int,
           seed: int) -> list[dict]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               os.path.join(ROOT, "configs", "accelerate", "cpu_ddp.yaml"), "--num_processes", str(processes),
               "--main_process_port", str(29500 + (hash(tag) % 400)), os.path.abspath(__file__), "--worker",
               "--tag", tag, "--api-base", api_base, "--out", out, "--steps", str(steps), "--retries", str(retries),
               "--seed", str(seed)]
    if max_rpm is not None:
        command += ["--max-rpm", str(max_rpm)]
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    run = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"launch {tag} failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}")
    return [json.load(open(os.path.join(out, f"{tag}.rank{rank}.json"))) for rank in range(processes)]


def quota_rows(args, out: str) -> list[dict]:
    from judge_server import JudgeServer

    rows = []
    for processes in args.processes:
        for limited in (False, True):
            tag = f"n{processes}_{'limited' if limited else 'unlimited'}"
            with JudgeServer(quota=(args.quota_rpm * args.window / 60, args.window), latency=args.latency,
                             max_lifetime=3600) as server:
                started = time.monotonic()
                ranks = launch(tag, processes, server.api_base, out, args.steps,
                               args.quota_rpm if limited else None, args.retries, args.seed)
                seconds = time.monotonic() - started
                seen_max = server.max_in_window(args.window, admitted_only=False)
                arrivals = sorted(server.arrival_times)
            judge = {name: sum(rank["judge"][name] for rank in ranks) for name in JUDGE_METRICS}
            steps = [statistics.mean(step) for step in zip(*(rank["step_s"] for rank in ranks))]
            active = (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else float("nan")
            burst = max(args.quota_rpm / 60 * 1.0, 1.0)  # burst_seconds = 1 (the default), summed over processes
            rows.append({
                "processes": processes, "limiter": limited, "requests_seen": len(arrivals),
                "max_in_window": seen_max, "quota_per_window": args.quota_rpm * args.window / 60,
                "bound_per_window": args.quota_rpm * args.window / 60 + burst,
                "rpm_seen": 60 * len(arrivals) / active if active > 0 else float("nan"),
                "http_429": judge["throttled"], "unscorable": judge["failures"], "retries": judge["retries"],
                "judge_wait_s_per_step": judge["rate_limit_wait_s"] / processes / args.steps,
                "step_s_mean": statistics.mean(steps), "wall_s": seconds,
            })
            print(json.dumps(rows[-1]), flush=True)
    return rows


def overhead_rows(args, out: str) -> dict:
    """Limiter on (far above the load) vs off, one process, no quota: mean step time ratio over alternating runs."""
    from judge_server import JudgeServer

    times = {False: [], True: []}
    with JudgeServer(latency=args.latency, max_lifetime=3600) as server:
        for repeat in range(args.overhead_repeats):
            for limited in (False, True):
                tag = f"overhead{repeat}_{'limited' if limited else 'unlimited'}"
                ranks = launch(tag, 1, server.api_base, out, args.steps, 1e7 if limited else None, args.retries,
                               args.seed + repeat)
                times[limited] += ranks[0]["step_s"][1:]  # the first step carries one-time costs
    off, on = statistics.mean(times[False]), statistics.mean(times[True])
    return {"step_s_unlimited": off, "step_s_limited": on, "ratio": on / off, "steps_each": len(times[True])}


def table(rows: list[dict], overhead: dict | None) -> str:
    lines = ["| processes | limiter | requests | max seen in any window (quota / +burst) | rpm seen | 429s | "
             "unscorable | limiter wait s/step | step s |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['processes']} | {'on' if row['limiter'] else 'off'} | {row['requests_seen']} | "
                     f"{row['max_in_window']} ({row['quota_per_window']:g} / {row['bound_per_window']:g}) | "
                     f"{row['rpm_seen']:.0f} | {row['http_429']:.0f} | {row['unscorable']:.0f} | "
                     f"{row['judge_wait_s_per_step']:.2f} | {row['step_s_mean']:.2f} |")
    if overhead:
        lines.append(f"\nLimiter not binding (1 process, no quota): step {overhead['step_s_limited']:.3f} s with vs "
                     f"{overhead['step_s_unlimited']:.3f} s without, ratio {overhead['ratio']:.3f} "
                     f"({overhead['steps_each']} steps each).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="run", help=argparse.SUPPRESS)
    parser.add_argument("--api-base", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--max-rpm", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--quota-rpm", type=float, default=300.0)
    parser.add_argument("--window", type=float, default=1.0, help="Seconds over which the server counts the quota.")
    parser.add_argument("--latency", type=float, default=0.05, help="Judge server latency per answer (s).")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--retries", type=int, default=4, help="judge_num_retries (the default).")
    parser.add_argument("--overhead-repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as out:
        rows = quota_rows(args, out)
        overhead = overhead_rows(args, out) if args.overhead_repeats else None
    text = table(rows, overhead)
    print(text)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
                       "cpus": os.cpu_count(), "settings": {k: v for k, v in vars(args).items() if k != "json"},
                       "quota": rows, "overhead": overhead, "table": text}, handle, indent=2)


if __name__ == "__main__":
    main()
