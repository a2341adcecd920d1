"""How a `LiteLLMJudge` answers a batch of requests: each unique request is looked up in the cache, else sent under
the key's claim (another process sending the same request is waited for), within the process's concurrency and
rate limits, retried with back-off, accounted (tokens, cost, latency) and its answer written to the cache.

`RequestEngine` is the request half of `LiteLLMJudge` (`client.py` holds its settings, identity, probe and budget):
it reads the settings and runtime state the client sets up in `_init_runtime`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from ppm_trl.judge import loop as shared_loop
from ppm_trl.judge.cache import request_fingerprint, request_key
from ppm_trl.judge.claims import KeyClaims
from ppm_trl.judge.errors import classify, first_lines, retry_after_seconds
from ppm_trl.judge.limits import clamped_usage, estimate_tokens, exhausted_for, usage_bounds, used_tokens_estimate
from ppm_trl.judge.redaction import redact, shown_error
from ppm_trl.judge.tasks import REQUEST_ERROR, UNREADABLE, JudgeFailure, Parser, with_nonce
from ppm_trl.judge.transport import import_litellm

logger = logging.getLogger("ppm_trl.judge.client")  # the client's logger, as before the split


class RequestEngine:
    """Cache, claims, attempts, retries and accounting of a judge's requests (mixed into `LiteLLMJudge`)."""

    # ------------------------------------------------------------------------------------ one request
    def _fingerprint(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """What the cache key hashes and a cache entry stores (see `cache.py`)."""
        return request_fingerprint(self.model, self.api_base, self.transport, messages, self._cache_params)

    def _server_wait_cap(self) -> float:
        """The longest a server's Retry-After or rate-limit reset is honoured at once: `backoff_max`, at most one
        attempt's `timeout`."""
        return min(self.backoff_max, self.timeout)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before the next attempt: the server's Retry-After if it sent one, else exponential back-off with
        jitter; never more than `backoff_max` nor one attempt's `timeout` (a server asking for an hour, or for a
        date decades ahead, is retried after the cap and the item fails when retries run out: no hang)."""
        cap = self._server_wait_cap()
        if retry_after is not None:
            return min(retry_after * self._rng.uniform(1.0, 1.1), cap)  # de-synchronise the herd a bit
        ceiling = min(cap, self.backoff_base * 2**attempt)
        return self._rng.uniform(ceiling / 2, ceiling)

    def _max_tokens(self) -> int | None:
        return self.litellm_kwargs.get("max_completion_tokens") or self.litellm_kwargs.get("max_tokens")

    def _bounded_usage(self, reply, messages: list[dict[str, str]]) -> None:
        """Clamp a reply's usage to what its request could have produced (`limits.usage_bounds`), re-priced and
        counted in `usage_clamped`: a server claiming 10^9 tokens must neither stall the token bucket for a day
        nor spend the budget at once."""
        if not reply.usage_known:
            return
        prompt, completion, clamped = clamped_usage(reply.prompt_tokens, reply.completion_tokens,
                                                    usage_bounds(messages, self._max_tokens()))
        if clamped:
            reply.prompt_tokens, reply.completion_tokens = prompt, completion
            pricing = getattr(self._transport, "pricing", None)
            reply.cost = None if reply.cost is None or pricing is None else pricing.cost(prompt, completion)
            self.stats.add(usage_clamped=1)

    def _account(self, reply, messages: list[dict[str, str]]) -> None:
        self.stats.add(
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cost=reply.cost or 0.0,
            cost_unknown=int(reply.cost is None),
            usage_unknown=int(not reply.usage_known),
            # A server that reports no usage still spends tokens: the token budget counts an estimate of them.
            estimated_tokens=0 if reply.usage_known else used_tokens_estimate(messages, reply.text),
        )

    def _cached(self, key: str, parse: Parser) -> Any:
        entry = self._cache_writer.get(key)
        return None if entry is None else self._parsed(parse, entry["content"])

    def _parsed(self, parse: Parser, text: Any) -> Any:
        """`parse(text)`, or None (unreadable) when there is no text or the parser raises: whatever an answer holds,
        it is one unscorable attempt, never an exception out of `grade_*`."""
        if not isinstance(text, str):
            return None
        try:
            return parse(text)
        except Exception as error:  # noqa: BLE001 - e.g. RecursionError on a pathological answer
            self._parser_errors = getattr(self, "_parser_errors", 0) + 1
            if self._parser_errors <= 3:  # counted as `unparseable` by the caller; the log says why, a few times
                logger.warning("judge answer parser raised %s on an answer of %d characters: counted as unreadable",
                               type(error).__name__, len(text))
            return None

    async def _answer(self, key: str, messages: list[dict[str, str]], parse: Parser, writes: list) -> Any:
        """One unique request → parsed answer or None (unscorable). Cache first; then, holding the key's claim
        (another process sending the same request is waited for and its cached answer used), the API."""
        if self._cache is not None:
            parsed = self._cached(key, parse)
            if parsed is not None:
                self.stats.add(cache_hits=1)
                return parsed
        if self._claims is None:
            return await self._send(key, messages, parse, writes)
        # A claim is an open lock file: only requests about to be sent hold one (at most the process's concurrency),
        # never the thousands queued behind them (3,000 held claims ran out of file descriptors for cache writes).
        async with self._loop_semaphores()[1]:
            lock, waited = await self._claims.claim(key)
            if waited:  # another process sent it meanwhile: its answer is on disk unless it got none
                parsed = self._cached(key, parse)
                if parsed is not None:
                    KeyClaims.release(lock)
                    self.stats.add(cache_hits=1, shared_across_processes=1)
                    return parsed
            mine: list[asyncio.Future] = []  # this request's cache write, if it gets an answer
            try:
                return await self._send(key, messages, parse, mine)
            finally:
                writes.extend(mine)
                if mine:  # keep the claim until the answer is on disk for the other processes
                    mine[-1].add_done_callback(lambda _: KeyClaims.release(lock))
                else:
                    KeyClaims.release(lock)

    def _loop_semaphores(self) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        """(attempts in flight, requests holding a claim), each `process_concurrency`, made for the running loop
        (first use, or a new loop after a fork)."""
        running = asyncio.get_running_loop()
        if self._semaphore_loop is not running:
            self._semaphore = asyncio.Semaphore(self.process_concurrency)
            self._claim_slots = asyncio.Semaphore(self.process_concurrency)
            self._semaphore_loop = running
        return self._semaphore, self._claim_slots

    async def _attempt(self, messages: list[dict[str, str]]) -> tuple[Any, BaseException | None, float]:
        """One attempt within the process's concurrency, request rate and token rate: (reply, error, sent at)."""
        estimate = self._limiter.token_reservation(estimate_tokens(messages, self._max_tokens())) \
            if self._limiter.active else 0
        async with self._semaphore:
            waited = await self._limiter.acquire(estimate)
            if waited > 0:
                self.stats.add(rate_limit_wait_s=waited)
            self.stats.add(attempts=1)
            sent = time.perf_counter()
            try:
                reply = await self._transport.send(messages, self.temperature)
            except Exception as caught:  # noqa: BLE001 - classified by the caller; bugs re-raise there
                if getattr(caught, "status_code", None) == 429:
                    self.stats.add(throttled=1)
                    retry_after = retry_after_seconds(caught)
                    if retry_after is not None:  # the server's word holds for every request of this process
                        self._limiter.pause_until(self._limiter.clock() + min(retry_after, self._server_wait_cap()))
                return None, caught, sent
        self._bounded_usage(reply, messages)
        if reply.usage_known:
            self._limiter.settle(estimate, reply.prompt_tokens + reply.completion_tokens)
        exhausted = exhausted_for(reply.headers or {})
        if exhausted is not None:
            self._limiter.pause_until(self._limiter.clock() + min(exhausted, self._server_wait_cap()))
        return reply, None, sent

    async def _send(self, key: str, messages: list[dict[str, str]], parse: Parser, writes: list) -> Any:
        """The API with retries; a new answer is queued for the cache and its write's future goes to `writes`."""
        self._loop_semaphores()
        self.stats.add(calls=1)
        started = None  # latency = first attempt sent → answer; waits for a slot or the rate limit excluded
        for attempt in range(self.num_retries + 1):
            if attempt:
                self.stats.add(retries=1)
            reply, error, sent = await self._attempt(messages)
            started = started or sent
            if error is not None:
                verdict = classify(error)
                if verdict == "fatal":
                    raise self._configuration_error(error) from None
                if verdict == "fail" or attempt == self.num_retries:
                    status = getattr(error, "status_code", None)
                    reason = (f"{type(error).__name__}{f' (HTTP {status})' if status else ''}: "
                              f"{shown_error(first_lines(error)) or f'no answer within {self.timeout:g} s'}")
                    return self._give_up(started, attempt + 1, reason, REQUEST_ERROR)
                await asyncio.sleep(self._backoff(attempt, retry_after_seconds(error)))
                continue
            self._account(reply, messages)
            parsed = self._parsed(parse, reply.text)
            if parsed is not None:
                self.stats.add_latency(time.perf_counter() - started)
                if self._cache is not None:
                    fingerprint = self._fingerprints.get(key) or self._fingerprint(messages)
                    entry = {"request": fingerprint, "content": reply.text, "created": time.time()}
                    writes.append(self._cache_writer.put(key, entry))
                return parsed
            self.stats.add(unparseable=1)
            if not self.retry_unparseable or attempt == self.num_retries:
                shown = _excerpt(reply.text or "")
                return self._give_up(started, attempt + 1, f"unreadable answer {shown!r}", UNREADABLE)
        raise AssertionError("unreachable: the last attempt always returns")

    async def _written(self, writes: list[asyncio.Future]) -> None:
        """Wait until a batch's new answers are in the cache (best effort: a failed write is counted and logged,
        rate-limited, by the cache; never raised)."""
        self._cache_writer.flush()
        await asyncio.gather(*writes)

    def _give_up(self, started: float, attempts: int, reason: str, kind: str) -> JudgeFailure:
        self.stats.add(failures=1)
        self.stats.add_latency(time.perf_counter() - started)
        failures = self.stats.failures
        if failures <= 10 or failures % 100 == 0:  # an outage must not flood the log
            logger.warning("judge request unscorable after %d attempt(s) (failure #%d): %s", attempts, failures, reason)
        self.last_failure = JudgeFailure(kind, reason, attempts)
        return self.last_failure

    async def _answer_many(self, jobs: Sequence[tuple[list[dict[str, str]], Parser]]) -> list[Any]:
        """Answer many (messages, parser) jobs concurrently; identical requests in the batch are sent once."""
        if jobs:
            import_litellm()  # once, before any latency clock starts (the first import takes seconds)
        self.stats.add(requests=len(jobs))
        tasks: dict[str, asyncio.Future] = {}
        keys = []
        owned: set[str] = set()  # keys this batch sends (the others are another batch's in-flight requests)
        writes: list[asyncio.Future] = []  # cache writes of the new answers
        try:
            for messages, parse in jobs:
                if self.echo_nonce:
                    messages, parse = with_nonce(messages, parse)
                fingerprint = self._fingerprint(messages)
                key = request_key(fingerprint)
                keys.append(key)
                if key in tasks:
                    self.stats.add(deduplicated=1)
                    continue
                if key in self._inflight:  # another batch (e.g. a concurrent scorer) is sending it right now
                    self.stats.add(deduplicated=1)
                    tasks[key] = self._inflight[key]
                    continue
                self._fingerprints[key] = fingerprint  # for the cache entry: hashing a prompt twice costs ~20 µs
                tasks[key] = self._inflight[key] = asyncio.ensure_future(self._answer(key, messages, parse, writes))
                owned.add(key)
                if len(tasks) % self.max_concurrency == 0:
                    await asyncio.sleep(0)  # let the first requests go out while the rest are keyed (~20 µs each)
            await asyncio.gather(*(asyncio.shield(task) for task in tasks.values()))
        except BaseException:  # a fatal error (or cancellation): do not leave the rest of the batch running
            for key in owned:
                tasks[key].cancel()
            if writes:
                self._cache_writer.flush()  # the answers already received are still cached, unwaited for
            raise
        finally:
            for key in owned:
                self._fingerprints.pop(key, None)
                self._inflight.pop(key, None)
        if writes:
            await self._written(writes)
        return [tasks[key].result() for key in keys]

    def _batch(self, jobs: Sequence[tuple[list[dict[str, str]], Parser]], explain: bool = False) -> list[Any]:
        return _explained(shared_loop.run_blocking(lambda: self._answer_many(jobs)), explain)

    async def _abatch(self, jobs: Sequence[tuple[list[dict[str, str]], Parser]], explain: bool = False) -> list[Any]:
        return _explained(await shared_loop.run_async(lambda: self._answer_many(jobs)), explain)


def _excerpt(text: str, keep: int = 150) -> str:
    """The start and end of an answer, redacted: only ~2 KB are redacted however long the answer (redacting
    megabytes on the event loop stalls every other request)."""
    if len(text) <= 2 * keep:
        return redact(text)
    margin = 1000  # a credential up to this long straddling the cut is still redacted whole
    head, tail = redact(text[: keep + margin])[:keep], redact(text[-(keep + margin):])[-keep:]
    return f"{head} … {tail}"


def _explained(results: list[Any], explain: bool) -> list[Any]:
    """Unscorable items as their `JudgeFailure` (explain) or as None (the task API's documented value)."""
    return results if explain else [None if isinstance(r, JudgeFailure) else r for r in results]
