"""Judge throughput: 1,024 PPM gradings against the loopback server (100 ms latency, max_concurrency=64).

Prints the wall time against the ideal ceil(1024/64)·0.1 s (target ratio <= 1.3), the client's CPU time per
request (all its threads: event loop, cache writer, caller) and the server's, and the load average, for both
transports: `litellm` (litellm.acompletion, the default) and `openai_http` (direct POST to an OpenAI-compatible
server through one aiohttp session). Then it repeats the run from the on-disk cache, which must send zero
requests. The server runs in its own process, as a real judge server would, so its CPU time is not charged to
the client; but on a machine with few cores it competes with the client for them, and its per-request CPU adds
to every request's latency, so it is reported too.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/judge_throughput.py [--requests 1024] [--latency 0.1] [--bare]

`--bare` also times the `openai_http` transport alone (prebuilt requests, no prompts, parsing, cache or stats):
what the HTTP client itself costs. To compare another version of the client, put its checkout first on the path
(`PYTHONPATH=/path/to/other/checkout`); the first line printed says which `ppm_trl` was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import sys
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price table
os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from judge_server import JudgeServer  # noqa: E402

import ppm_trl  # noqa: E402
from ppm_trl.judge import LiteLLMJudge  # noqa: E402
from ppm_trl.judge.transport import OpenAIHTTPTransport  # noqa: E402

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']


def serve(connection, latency: float) -> None:
    """Child process: run the server and answer 'count' / 'reset' / 'cpu' / 'stop' over the pipe."""
    with JudgeServer(latency=latency, max_lifetime=900) as server:
        connection.send(server.api_base)
        while (command := connection.recv()) != "stop":
            if command == "reset":
                server.reset_counters()
            connection.send(time.process_time() if command == "cpu" else server.requests)


def ask(server, command: str):
    server.send(command)
    return server.recv()


def benchmark(args: argparse.Namespace, transport: str, server, api_base: str) -> None:
    items = [("Problem", POINTS, f"attempt {i}: alpha then gamma") for i in range(args.requests)]
    ideal = math.ceil(args.requests / args.max_concurrency) * args.latency
    with tempfile.TemporaryDirectory() as cache_dir:
        judge = LiteLLMJudge(args.model, api_base=api_base, max_concurrency=args.max_concurrency, timeout=30,
                             cache_dir=cache_dir, transport=transport)
        judge.complete([[{"role": "user", "content": "warm-up"}]])  # import LiteLLM, open the connection pool
        ask(server, "reset")
        server_cpu = ask(server, "cpu")
        wall, cpu = time.perf_counter(), time.process_time()
        grades = judge.grade_prefixes(items)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server_cpu = ask(server, "cpu") - server_cpu
        print(f"[transport={transport}] cold run: {args.requests} gradings, {ask(server, 'count')} requests "
              f"reached the server, {sum(g is not None for g in grades)} graded")
        print(f"    elapsed {wall:.2f} s vs ideal {ideal:.2f} s -> ratio {wall / ideal:.2f} (target <= 1.3); "
              f"client CPU {1000 * cpu / args.requests:.2f} ms/request; server CPU {1000 * server_cpu / args.requests:.2f} "
              f"ms/request; latency p50 {judge.stats.snapshot()['latency_p50']:.3f} s; load average "
              f"{os.getloadavg()[0]:.1f}")
        ask(server, "reset")
        wall = time.perf_counter()
        cached = judge.grade_prefixes(items)
        wall = time.perf_counter() - wall
        print(f"    cached run: elapsed {wall:.2f} s, {ask(server, 'count')} requests reached the server, "
              f"identical grades: {cached == grades}")
        judge.close()


def bare(args: argparse.Namespace, api_base: str) -> None:
    """The transport alone, `max_concurrency` requests in flight, after a first round has opened the connections."""
    transport = OpenAIHTTPTransport(args.model, api_base, 30.0, None, {})
    transport.max_concurrency = args.max_concurrency  # the connector's limit (older clients had no limit)
    requests = [[{"role": "user", "content": f"request {i}: " + "x" * 2000}] for i in range(args.requests)]
    ideal = math.ceil(args.requests / args.max_concurrency) * args.latency

    async def run() -> tuple[float, float]:
        slots = asyncio.Semaphore(args.max_concurrency)

        async def send(messages):
            async with slots:
                return await transport.send(messages, 0.0)

        await asyncio.gather(*(send(messages) for messages in requests[: args.max_concurrency]))
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(send(messages) for messages in requests))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        await transport.aclose()
        return wall, cpu

    wall, cpu = asyncio.run(run())
    print(f"[bare openai_http transport] {args.requests} requests: elapsed {wall:.2f} s vs ideal {ideal:.2f} s -> "
          f"ratio {wall / ideal:.2f}; client CPU {1000 * cpu / args.requests:.3f} ms/request; load average "
          f"{os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--model", default="openai/scripted-judge", help="e.g. hosted_vllm/scripted-judge")
    parser.add_argument("--transport", choices=["litellm", "openai_http", "both"], default="both")
    parser.add_argument("--bare", action="store_true", help="also time the openai_http transport alone")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; ppm_trl from "
          f"{os.path.dirname(os.path.dirname(os.path.abspath(ppm_trl.__file__)))}")
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=serve, args=(child, args.latency), daemon=True)
    process.start()
    api_base = parent.recv()
    try:
        for transport in ["litellm", "openai_http"] if args.transport == "both" else [args.transport]:
            benchmark(args, transport, parent, api_base)
        if args.bare:
            bare(args, api_base)
    finally:
        parent.send("stop")
        process.join(10)


if __name__ == "__main__":
    main()
