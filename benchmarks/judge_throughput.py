"""Judge throughput: 1,024 PPM gradings against the loopback server (100 ms latency, max_concurrency=64).

Prints the wall time against the ideal ceil(1024/64)·0.1 s (target ratio < 1.25), the CPU time per request (on a
CPU-starved machine LiteLLM's own per-request overhead, not concurrency, bounds the throughput), then repeats the
run from the on-disk cache, which must send zero requests.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/judge_throughput.py [--requests 1024] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price table
os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from judge_server import JudgeServer  # noqa: E402

from ppm_trl.judge import LiteLLMJudge  # noqa: E402

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']


def timed_run(judge: LiteLLMJudge, items) -> tuple[float, float, list]:
    wall, cpu = time.perf_counter(), time.process_time()
    grades = judge.grade_prefixes(items)
    return time.perf_counter() - wall, time.process_time() - cpu, grades


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--model", default="openai/scripted-judge", help="e.g. hosted_vllm/scripted-judge")
    parser.add_argument("--transport", choices=["litellm", "openai_http", "both"], default="both")
    args = parser.parse_args()
    for transport in ["litellm", "openai_http"] if args.transport == "both" else [args.transport]:
        benchmark(args, transport)


def benchmark(args: argparse.Namespace, transport: str) -> None:

    items = [("Problem", POINTS, f"attempt {i}: alpha then gamma") for i in range(args.requests)]
    ideal = math.ceil(args.requests / args.max_concurrency) * args.latency
    with JudgeServer(latency=args.latency) as server, tempfile.TemporaryDirectory() as cache_dir:
        judge = LiteLLMJudge(args.model, api_base=server.api_base, max_concurrency=args.max_concurrency,
                             timeout=30, cache_dir=cache_dir, transport=transport)
        judge.complete([[{"role": "user", "content": "warm-up"}]])  # import LiteLLM, open the connection pool
        server.reset_counters()

        wall, cpu, grades = timed_run(judge, items)
        graded = sum(g is not None for g in grades)
        print(f"[transport={transport}]")
        print(f"cold run : {args.requests} gradings, {server.requests} requests reached the server, {graded} graded")
        print(f"           elapsed {wall:.2f} s vs ideal {ideal:.2f} s -> ratio {wall / ideal:.2f} (target < 1.25)")
        print(f"           CPU {cpu:.2f} s = {1000 * cpu / args.requests:.2f} ms per request (client + server), "
              f"{os.cpu_count()} cores; latency p50 {judge.stats.snapshot()['latency_p50']:.3f} s")

        server.reset_counters()
        wall, cpu, cached = timed_run(judge, items)
        print(f"cached   : elapsed {wall:.2f} s, {server.requests} requests reached the server, "
              f"identical grades: {cached == grades}")
        judge.close()


if __name__ == "__main__":
    main()
