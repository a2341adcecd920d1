"""Request and token rate limits for the judge: token buckets for a run's total quota, split across processes.

A hosted judge's quota (requests per minute, tokens per minute) is the run's, not one process's: with
`accelerate launch` on N processes each judge client takes `1/N` of it (`process_share`). A static split needs
no coordination between processes or nodes and cannot overshoot; its cost is that a rank with less judging to do
leaves part of its share unused (the ranks of one GRPO step judge equally sized slices, so this is small).

`TokenBucket` is pure arithmetic on a clock value passed in (tested with a fake clock): a reservation takes its
units now and says how long to wait until the bucket would have held them ("virtual scheduling"), so waiters are
served in arrival order and the long-run rate never exceeds `rate`, with at most `capacity` units at once.
Tokens are reserved on an estimate before a request is sent and corrected with the reply's usage.

The server is the source of truth when it speaks: a 429's `Retry-After`, or `x-ratelimit-remaining-* = 0` with its
`x-ratelimit-reset-*`, pauses every request of this process until then (`RateLimiter.pause_until`).

Nothing a server says can stall the judge: a header value that is not a finite number >= 0 (`nan`, `inf`, `-5`) is
ignored; no wait (the token bucket's debt, a pause, a claim on another process's request) lasts longer than
`longest_wait_seconds` — what one request may take when every attempt times out; a reply's `usage` above what its
request could have produced is clamped to that (`usage_bounds`); and one request reserves at most the bucket's
capacity, so a huge row cannot make every other request wait for its estimate.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field


def process_count() -> int:
    """Processes sharing the run's judge quota: `WORLD_SIZE` as set by `accelerate launch` / torchrun, else 1."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def process_share(total: float | None, processes: int) -> float | None:
    """This process's part of a run-wide limit (None: unlimited)."""
    return None if total is None else total / processes


def longest_wait_seconds(timeout: float, attempts: int) -> float:
    """The bound on any one wait of the judge: what a request may take when each of its `attempts` times out.
    A longer wait can only come from a server's (or a stopped process's) say-so, which must not stall a run."""
    return timeout * max(attempts, 1)


def server_seconds(value: object, scale: float = 1.0) -> float | None:
    """A number of seconds a server wrote in a header (`value` × `scale`: 0.001 for milliseconds); None unless it
    is a finite number >= 0 — `nan` would escape every `min()` cap, `inf` and negatives mean nothing."""
    try:
        seconds = float(str(value).strip()) * scale
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


@dataclass
class TokenBucket:
    """`rate` units per second, at most `capacity` at once; starts full. `level` may go negative: reserved ahead."""

    rate: float
    capacity: float
    level: float = field(default=math.nan)
    updated: float = field(default=math.nan)
    max_debt: float = math.inf  # the level never goes below -max_debt: no reservation waits over max_debt / rate

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.capacity > 0):
            raise ValueError(f"a token bucket needs rate > 0 and capacity > 0, got {self.rate!r}, {self.capacity!r}")
        if not self.max_debt >= 0:
            raise ValueError(f"a token bucket needs max_debt >= 0, got {self.max_debt!r}")
        if math.isnan(self.level):
            self.level = self.capacity

    def _refill(self, now: float) -> None:
        if not math.isnan(self.updated) and now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        if math.isnan(self.updated) or now > self.updated:
            self.updated = now

    def reserve(self, amount: float, now: float) -> float:
        """Take `amount` units; return the seconds to wait before using them (0 when the bucket held them)."""
        self._refill(now)
        self.level = max(self.level - amount, -self.max_debt)
        return 0.0 if self.level >= 0 else -self.level / self.rate

    def adjust(self, amount: float, now: float) -> None:
        """Correct an earlier reservation by `amount` units (positive: more were used; negative: give back)."""
        self._refill(now)
        self.level = min(self.capacity, max(self.level - amount, -self.max_debt))


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def duration_seconds(value: str) -> float | None:
    """A rate-limit reset as servers write it: seconds ("1.5"), or OpenAI's "6m0s" / "20ms" / "1h2m3.5s"."""
    value = value.strip()
    try:
        float(value)
    except ValueError:
        pass
    else:  # a plain number: only a finite one >= 0 is a duration
        return server_seconds(value)
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(number + unit for number, unit in parts) != value:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


def exhausted_for(headers: Mapping[str, str]) -> float | None:
    """Seconds until the server's quota resets when a reply says it is used up (`x-ratelimit-remaining-requests`
    or `-tokens` is 0, with the matching `x-ratelimit-reset-*`); None when it is not, or the headers do not say."""
    lowered = {str(k).lower().removeprefix("llm_provider-"): str(v) for k, v in headers.items()}
    waits = []
    for kind in ("requests", "tokens"):
        remaining, reset = lowered.get(f"x-ratelimit-remaining-{kind}"), lowered.get(f"x-ratelimit-reset-{kind}")
        if remaining is None or reset is None:
            continue
        if server_seconds(remaining) != 0:  # some left, or not a count (`nan` is not "none left")
            continue
        seconds = duration_seconds(reset)
        if seconds is not None:
            waits.append(seconds)
    return max(waits) if waits else None


def prompt_tokens_estimate(messages: list[dict[str, str]]) -> int:
    """~4 characters per token, plus a few per message for the chat template."""
    characters = sum(len(str(message.get("content", ""))) for message in messages)
    return characters // 4 + 8 * len(messages)


def estimate_tokens(messages: list[dict[str, str]], max_tokens: int | None) -> int:
    """Tokens a request will count against a tokens-per-minute quota, before it is sent: ~4 characters per prompt
    token, plus the answer's `max_tokens` when set (else a small allowance). Corrected by the reply's usage."""
    return prompt_tokens_estimate(messages) + (max_tokens if max_tokens else 64)


def used_tokens_estimate(messages: list[dict[str, str]], answer: str | None) -> int:
    """The tokens an answer whose server reported no usage is counted as (in the token budget): ~4 characters per
    token of the prompt and of the answer's text."""
    return prompt_tokens_estimate(messages) + len(answer or "") // 4 + 1


# A judge answer with no `max_tokens` set is bounded by a long model context (reasoning tokens included).
UNSET_MAX_TOKENS_BOUND = 131_072
_USAGE_SLACK_TOKENS = 64  # per side: a server's count may include a few tokens the estimate cannot see


def usage_bounds(messages: list[dict[str, str]], max_tokens: int | None) -> tuple[int, int]:
    """(prompt, completion) token counts no honest server can exceed for this request: a token is at least one
    UTF-8 byte of the prompt (plus a few template tokens per message), and the answer has at most `max_tokens`."""
    prompt_bytes = sum(len(str(message.get("content", "")).encode("utf-8", "surrogatepass")) for message in messages)
    prompt = prompt_bytes + 16 * len(messages) + _USAGE_SLACK_TOKENS
    return prompt, (max_tokens if max_tokens else UNSET_MAX_TOKENS_BOUND) + _USAGE_SLACK_TOKENS


def clamped_usage(prompt_tokens: int, completion_tokens: int, bounds: tuple[int, int]) -> tuple[int, int, bool]:
    """(prompt, completion, clamped): a reply's usage, each count cut to its bound (`usage_bounds`)."""
    prompt, completion = min(prompt_tokens, bounds[0]), min(completion_tokens, bounds[1])
    return prompt, completion, (prompt, completion) != (prompt_tokens, completion_tokens)


class RateLimiter:
    """Requests-per-minute and tokens-per-minute limits of one process, with server-driven pauses.

    `await acquire(tokens)` returns the seconds it waited; `settle(estimate, used)` corrects the token bucket once
    the reply's usage is known; `pause_until(deadline)` holds every later (and waiting) request until `deadline`.
    No acquire waits longer than `max_wait_seconds` (the buckets' debt is capped at that many seconds of their
    rate): past it the request goes, and a server that is really over its quota says so with a 429.
    `clock` / `sleep` are injectable so that the schedule is tested without real time passing.
    """

    def __init__(self, max_rpm: float | None = None, max_tpm: float | None = None, burst_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, max_wait_seconds: float = math.inf):
        if burst_seconds <= 0:
            raise ValueError(f"burst_seconds must be > 0, got {burst_seconds!r}")
        if not max_wait_seconds > 0:
            raise ValueError(f"max_wait_seconds must be > 0, got {max_wait_seconds!r}")
        self.max_rpm, self.max_tpm, self.max_wait_seconds = max_rpm, max_tpm, max_wait_seconds

        def bucket(per_minute: float | None) -> TokenBucket | None:
            # A burst is `burst_seconds` of the steady rate, at least one request (or one minute's tokens / 60).
            if per_minute is None:
                return None
            rate = per_minute / 60
            return TokenBucket(rate, max(rate * burst_seconds, 1.0), max_debt=rate * max_wait_seconds)

        self.requests, self.tokens = bucket(max_rpm), bucket(max_tpm)
        self.clock, self.sleep = clock, sleep
        self.paused_until = -math.inf

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def pause_until(self, deadline: float) -> None:
        if not math.isnan(deadline):
            self.paused_until = max(self.paused_until, deadline)

    def token_reservation(self, estimate: int) -> int:
        """What a request reserves of the token bucket: its estimate, at most the bucket's capacity (one huge row
        must not make every request behind it wait for its estimate; its real usage is settled afterwards)."""
        return estimate if self.tokens is None else min(estimate, math.ceil(self.tokens.capacity))

    def plan(self, tokens: int, now: float) -> float:
        """Reserve one request and `tokens` tokens at `now`; the seconds to wait before sending."""
        wait = 0.0
        if self.requests is not None:
            wait = max(wait, self.requests.reserve(1, now))
        if self.tokens is not None:
            wait = max(wait, self.tokens.reserve(tokens, now))
        return min(max(wait, self.paused_until - now), self.max_wait_seconds)

    async def acquire(self, tokens: int = 0) -> float:
        started = self.clock()
        wait = self.plan(tokens, started)
        if wait <= 0:
            return 0.0
        while wait > 0:
            await self.sleep(wait)
            now = self.clock()  # a 429 that arrived meanwhile extends the wait, within the bound
            wait = min(self.paused_until, started + self.max_wait_seconds) - now
        return self.clock() - started

    def settle(self, estimate: int, used: int) -> None:
        if self.tokens is not None:
            self.tokens.adjust(used - estimate, self.clock())
