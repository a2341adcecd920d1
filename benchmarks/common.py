"""Helpers the benchmark scripts share: run caching, aggregation, markdown tables."""

from __future__ import annotations

import json
import math
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if ROOT not in sys.path:  # run as `python benchmarks/x.py` from a checkout without installing
    sys.path.insert(0, ROOT)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def cached_run(path: str, compute):
    """The JSON at `path` if a previous (interrupted) invocation wrote it, else `compute()` written there."""
    if os.path.exists(path):
        with open(path) as handle:
            return json.load(handle)
    result = compute()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle, indent=2)
    os.replace(path + ".tmp", path)
    return result


def mean_spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample std) — std 0 for a single value."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def samples_to_target(history: list[dict], target: float, key: str = "all_correct") -> int | None:
    """Training samples at the first evaluation whose `key` reaches `target`; None if never."""
    for point in history:
        if point[key] >= target:
            return point["samples"]
    return None


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
