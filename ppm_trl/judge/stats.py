"""Judge statistics: counters, latency percentiles, tokens and cost — cumulative and per logging window.

Counters (all cumulative; `since(snapshot)` gives the window's deltas):
  requests      items the task API was asked to answer (before de-duplication and cache)
  skipped_empty empty prefixes answered "nothing reached" without a request
  deduplicated  identical requests within one batch, answered by the first
  cache_hits    answered from the on-disk cache (no request, no cost)
  calls         requests that went to the API (each may take several attempts)
  attempts      HTTP attempts (= calls + retries)
  retries       re-sent attempts after a 429/5xx/timeout/connection error or an unreadable answer
  unparseable   answers that arrived but no parser could read (each is retried while retries remain)
  failures      calls that gave up: the item is unscorable (None), never a silent 0
  prompt_tokens / completion_tokens / cost   LiteLLM's usage and price of every answer received
  cost_unknown  answers LiteLLM could not price (their cost is not in `cost`)
  usage_unknown answers whose token counts were missing, not numbers, or 0 prompt tokens (counted as 0 tokens,
                cost unknown; an all-zero usage is how LiteLLM fills a missing one)
  estimated_tokens tokens of the usage_unknown answers, estimated from their text; counted in the token budget
  usage_clamped answers whose usage claimed more tokens than their request could produce (cut to that bound)
  cache_rejected cache files ignored because their stored request does not match their key (planted, foreign)
  cache_write_failures answers that could not be written to the cache (kept for this run, asked again next time)
  quarantined   requests not sent because their row is quarantined (unscorable in several attempts; see callback)
  throttled     attempts the server answered 429 (rate limited); each is retried after its Retry-After
  rate_limit_wait_s seconds requests waited for `max_rpm` / `max_tpm` / a server's Retry-After (summed)
  shared_across_processes answers another process sharing the cache sent while this one waited (also cache_hits)
Latency is per call, end to end (all attempts and back-off), i.e. what a training step waits for.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Sequence

COUNTERS = (
    "requests",
    "skipped_empty",
    "deduplicated",
    "cache_hits",
    "calls",
    "attempts",
    "retries",
    "unparseable",
    "failures",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "cost_unknown",
    "usage_unknown",
    "estimated_tokens",
    "usage_clamped",
    "cache_rejected",
    "cache_write_failures",
    "quarantined",
    "throttled",
    "rate_limit_wait_s",
    "shared_across_processes",
)
_KNOWN = frozenset(COUNTERS)
_MAX_LATENCIES = 200_000  # keep the most recent; enough for any logging window


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class JudgeStats:
    """Thread-safe judge counters. `snapshot()` → dict; `since(previous_snapshot)` → the window's deltas."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._latencies = array("d")
        self._latencies_dropped = 0  # how many old latencies were discarded to bound memory

    def add(self, **increments: float) -> None:
        if not _KNOWN.issuperset(increments):  # called several times per request: no sets built on the way
            raise KeyError(f"unknown judge counters {sorted(set(increments) - _KNOWN)}; known: {COUNTERS}")
        with self._lock:
            for name, value in increments.items():
                self._counts[name] += value

    def add_latency(self, seconds: float) -> None:
        with self._lock:
            self._latencies.append(seconds)
            if len(self._latencies) > 2 * _MAX_LATENCIES:
                drop = len(self._latencies) - _MAX_LATENCIES
                del self._latencies[:drop]
                self._latencies_dropped += drop

    def __getattr__(self, name: str):
        if name in COUNTERS:
            with self._lock:
                return self._counts[name]
        raise AttributeError(name)

    def snapshot(self) -> dict[str, float]:
        """Cumulative counters, `latency_count`, and p50/p95 (seconds) over the recent latencies (NaN if none)."""
        with self._lock:
            out: dict[str, float] = dict(self._counts)
            latencies = list(self._latencies)
            out["latency_count"] = self._latencies_dropped + len(latencies)
        out.update(self._percentiles(latencies))
        return out

    def since(self, previous: dict[str, float] | None) -> dict[str, float]:
        """Deltas of every counter since `previous` (a `snapshot()`; None = since the start), with p50/p95 over
        the latencies recorded in that window (NaN when no call finished in it)."""
        current = self.snapshot()
        previous = previous or {}
        out = {name: current[name] - previous.get(name, 0) for name in COUNTERS}
        with self._lock:
            start = max(int(previous.get("latency_count", 0)) - self._latencies_dropped, 0)
            latencies = list(self._latencies[start:])
        out["latency_count"] = len(latencies)
        out.update(self._percentiles(latencies))
        return out

    @staticmethod
    def _percentiles(latencies: list[float]) -> dict[str, float]:
        if not latencies:
            return {"latency_p50": math.nan, "latency_p95": math.nan}
        return {"latency_p50": percentile(latencies, 50), "latency_p95": percentile(latencies, 95)}

    def __repr__(self) -> str:
        with self._lock:
            shown = ", ".join(f"{k}={v:g}" for k, v in self._counts.items())
        return f"JudgeStats({shown})"
