"""`LiteLLMJudge`: a concurrent, cached, retrying LLM-as-a-judge client on `litellm.acompletion`.

Any LiteLLM model string works (`gemini/gemini-2.5-flash-lite`, `openai/gpt-4o-mini`, `hosted_vllm/<name>` with
`api_base` for a local vLLM/SGLang server). Requests run on a background asyncio loop (`loop.py`), so the
synchronous task API (`grade_prefixes`, `score_rubric`, ...) works from inside a TRL training step even when TRL
runs its own loop in another thread; the `a*` coroutines serve callers that are already async.

Per request: the on-disk cache is consulted first; identical requests are sent once (in one batch, across the
batches in flight, and across processes sharing a cache directory: `cache.KeyClaims`); at most `max_concurrency`
attempts are in flight and `max_rpm` / `max_tpm` are kept (`limits.py`; all three are the run's totals, each of
N processes takes 1/N); 429/5xx/timeouts/connection errors are retried with exponential back-off and jitter,
honouring `Retry-After` (a 429's pauses every request of the process); an answer no parser can read is retried
too (and never cached). `max_cost_usd` / `max_total_tokens` are a budget: `budget_exhausted()` says when it is
spent, and training (`JudgeBudgetCallback`) or `prepare` stop there.
New answers are written to the cache in batches (`cache.CacheWriter`) and are on disk when their batch returns.
LiteLLM's own retries are switched off so the counts in `stats` are exact. When retries run out the item is
unscorable (None) and counted — never a silent 0.

API keys come from the environment only (the provider's usual variable, or the one named by `api_key_env`);
they are read when a request is sent and are never stored, logged, shown in `repr` or returned by `config()`.
A local OpenAI-compatible server that needs no key works with no variable set: `openai_http` then sends no
Authorization header, LiteLLM's `hosted_vllm/` needs none, and for LiteLLM's `openai/` with an `api_base` the
judge passes a placeholder key (its SDK refuses to send without one). A refused or missing key (401/403), an
unknown model (404) raise `JudgeConfigurationError` at once, never retried; `probe()` checks all that, and that a
server listens at `api_base`, with one tiny request before any work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from typing import Any

from ppm_trl.judge import loop as shared_loop
from ppm_trl.judge.cache import CacheWriter, ResponseCache
from ppm_trl.judge.claims import KeyClaims
from ppm_trl.judge.errors import (
    MISSING_KEY,
    JudgeConfigurationError,
    causes,
    classify,
    first_lines,
    is_connection_refused,
)
from ppm_trl.judge.limits import RateLimiter, longest_wait_seconds, process_count, process_share
from ppm_trl.judge.redaction import (
    credential_arguments,
    remember_key_variable,
    shown_error,
)
from ppm_trl.judge.sending import RequestEngine
from ppm_trl.judge.settings import CLIENT_SETTINGS, check_judge_settings
from ppm_trl.judge.stats import JudgeStats
from ppm_trl.judge.tasks import JudgeFailure, JudgeTasks
from ppm_trl.judge.transport import (
    DEFAULT_MAX_RESPONSE_BYTES,
    TRANSPORT_ARGUMENTS,
    TRANSPORTS,
    import_litellm,
)

logger = logging.getLogger(__name__)


# Providers whose key variable LiteLLM reads; others: `<PROVIDER>_API_KEY`.
_KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "hosted_vllm": "HOSTED_VLLM_API_KEY", "gemini": "GEMINI_API_KEY",
                  "anthropic": "ANTHROPIC_API_KEY", "openrouter": "OPENROUTER_API_KEY", "azure": "AZURE_API_KEY"}
# LiteLLM's `openai/` client refuses to send without a key even to a local server that needs none.
_NO_KEY_NEEDED = "sk-no-key-needed"
PROBE_MAX_TOKENS = 8


class LiteLLMJudge(RequestEngine, JudgeTasks):
    """LLM-as-a-judge through LiteLLM with bounded concurrency, retries, an on-disk cache and accounting.

    Args:
        model: LiteLLM model string, e.g. "gemini/gemini-2.5-flash-lite" (the PPM paper's judge), "openai/gpt-oss-20b".
        api_base: server URL for self-hosted models ("http://host:8000/v1").
        max_concurrency: attempts in flight at once, for the whole run (each of N processes takes 1/N, at least 1).
        max_rpm / max_tpm: the run's requests / tokens per minute (a hosted judge's quota), split like
            max_concurrency; None: unlimited. Tokens are estimated before a request and corrected by its usage.
        burst_seconds: how many seconds of the steady rate may go out at once (at least one request).
        processes: how many processes share these totals; None: `WORLD_SIZE` (set by accelerate/torchrun), else 1.
        max_cost_usd / max_total_tokens: the budget `budget_exhausted()` checks (None: no budget). A cost budget
            needs a model LiteLLM can price.
        timeout: seconds before an attempt counts as timed out (and is retried).
        num_retries: extra attempts per request after the first.
        temperature: judge sampling temperature (0 = deterministic, cache-friendly).
        cache_dir: directory of the persistent answer cache; None disables caching.
        api_key_env: name of an environment variable holding the key, when not the provider's default one.
        backoff_base / backoff_max: exponential back-off (seconds) between attempts, with jitter; backoff_max (and
            `timeout`) also caps a server's Retry-After / retry-after-ms.
        retry_unparseable: re-send a request whose answer no parser can read (counts as a retry).
        transport: "litellm" (`litellm.acompletion`, any provider) or "openai_http" (direct POST to an
            OpenAI-compatible `api_base` with `openai/…` or `hosted_vllm/…` models: no LiteLLM per-request CPU
            overhead, for fast local servers; see `transport.py`).
        max_response_bytes: the largest answer body (decoded) an attempt accepts; a larger one fails the attempt
            (`openai_http` stops reading at the cap, so a decompression bomb costs at most this much; LiteLLM can
            only refuse the text it returns).
        echo_nonce: ask the judge to start each answer with a per-request nonce and refuse (retry, never cache) an
            answer without it — catches a server that returns another request's answer (`tasks.with_nonce`).
        **litellm_kwargs: extra `litellm.acompletion` arguments (max_tokens, reasoning_effort, ...); they are part
            of the cache key. Credentials are refused here — use the environment.
    """

    def __init__(
        self,
        model: str,
        api_base: str | None = None,
        max_concurrency: int = 64,
        timeout: float = 60.0,
        num_retries: int = 4,
        temperature: float = 0.0,
        cache_dir: str | os.PathLike | None = None,
        api_key_env: str | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_unparseable: bool = True,
        transport: str = "litellm",
        max_rpm: float | None = None,
        max_tpm: float | None = None,
        burst_seconds: float = 1.0,
        processes: int | None = None,
        max_cost_usd: float | None = None,
        max_total_tokens: int | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        echo_nonce: bool = False,
        **litellm_kwargs: Any,
    ):
        check_judge_settings(dict(model=model, api_base=api_base, max_concurrency=max_concurrency, timeout=timeout,
                                  num_retries=num_retries, temperature=temperature, transport=transport,
                                  api_key_env=api_key_env, max_rpm=max_rpm, max_tpm=max_tpm, burst_seconds=burst_seconds,
                                  max_cost_usd=max_cost_usd, max_total_tokens=max_total_tokens,
                                  max_response_bytes=max_response_bytes, echo_nonce=echo_nonce))
        if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 1):
            raise ValueError(f"processes must be an integer >= 1 (or None: WORLD_SIZE), got {processes!r}")
        if backoff_base < 0 or backoff_max < 0:
            raise ValueError(f"backoff_base and backoff_max must be >= 0, got {backoff_base!r}, {backoff_max!r}")
        refused = credential_arguments(litellm_kwargs)
        if refused:
            raise ValueError(
                f"credential argument(s) {refused} refused: API keys come from the environment only. Set the "
                "provider's variable (OPENAI_API_KEY, GEMINI_API_KEY, ...) or name one with api_key_env='MY_KEY'."
            )
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise ValueError(f"api_key_env={api_key_env!r} names an environment variable that is not set")
        for name in ("model", "messages", "temperature", "stream", "n"):
            if name in litellm_kwargs:
                raise ValueError(f"litellm argument {name!r} is set by the judge itself; pass it as a judge argument")
        self.model = model
        self.api_base = api_base
        self.max_concurrency = max_concurrency
        self.timeout = float(timeout)
        self.num_retries = num_retries
        self.temperature = float(temperature)
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.api_key_env = api_key_env
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.retry_unparseable = retry_unparseable
        self.transport = transport
        self.max_rpm, self.max_tpm, self.burst_seconds = max_rpm, max_tpm, float(burst_seconds)
        self.processes = processes
        self.max_cost_usd, self.max_total_tokens = max_cost_usd, max_total_tokens
        self.max_response_bytes = max_response_bytes
        self.echo_nonce = echo_nonce
        self.litellm_kwargs = dict(litellm_kwargs)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.stats = JudgeStats()
        processes = self.processes or process_count()
        self.process_concurrency = max(1, self.max_concurrency // processes)
        self._inflight: dict[str, asyncio.Future] = {}  # key -> the answer of a request being sent by any batch
        if self.api_key_env is not None:
            remember_key_variable(self.api_key_env)  # so that `redact` masks its value whatever its name
        self._cache = None if self.cache_dir is None else ResponseCache(
            self.cache_dir, on_reject=lambda: self.stats.add(cache_rejected=1),
            on_write_error=lambda: self.stats.add(cache_write_failures=1),
        )
        self._cache_writer = None if self._cache is None else CacheWriter(self._cache)
        # No wait of this judge (rate limits, a server's pause, another process's claim) outlasts one whole request.
        self.longest_wait_seconds = longest_wait_seconds(self.timeout, self.num_retries + 1)
        self._limiter = RateLimiter(process_share(self.max_rpm, processes), process_share(self.max_tpm, processes),
                                    self.burst_seconds, max_wait_seconds=self.longest_wait_seconds)
        self._claims = None if self._cache is None else KeyClaims(self.cache_dir,
                                                                  max_wait_seconds=self.longest_wait_seconds)
        self._semaphore: asyncio.Semaphore | None = None
        self._claim_slots: asyncio.Semaphore | None = None  # requests holding a claim lock: see `_answer`
        self._fingerprints: dict[str, dict[str, Any]] = {}  # key -> request fingerprint, while its batch runs
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None
        self._rng = random.Random()
        self._transport = TRANSPORTS[self.transport](
            self.model, self.api_base, self.timeout, self.api_key_env, self._transport_kwargs(), self.process_concurrency,
            max_response_bytes=self.max_response_bytes,
        )
        self.last_failure: JudgeFailure | None = None  # the most recent unscorable item's reason (for error messages)
        shared_loop.register_closer(self._transport)  # closed at interpreter exit if close() is never called
        self._cache_params = {"temperature": self.temperature} | {
            k: v for k, v in self.litellm_kwargs.items() if k not in TRANSPORT_ARGUMENTS
        }

    def key_variable(self) -> str | None:
        """The environment variable the judge's key is read from (None: the provider's own scheme, e.g. Vertex)."""
        if self.api_key_env:
            return self.api_key_env
        provider = self.model.partition("/")[0]
        if provider in _KEY_VARIABLES:
            return _KEY_VARIABLES[provider]
        return f"{provider.upper()}_API_KEY" if "/" in self.model else None

    def _transport_kwargs(self) -> dict[str, Any]:
        """`litellm_kwargs`, plus a placeholder key for LiteLLM's `openai/` client when an `api_base` server is
        used with no key set: a local server that needs none then works; one that needs a key answers 401."""
        needs_placeholder = (self.transport == "litellm" and self.api_base and self.model.startswith("openai/")
                             and not self.api_key_env and not os.environ.get("OPENAI_API_KEY"))
        return {**self.litellm_kwargs, "api_key": _NO_KEY_NEEDED} if needs_placeholder else self.litellm_kwargs

    def _configuration_error(self, error: BaseException) -> JudgeConfigurationError:
        status = getattr(error, "status_code", None)
        if any(MISSING_KEY.search(str(c)) for c in causes(error)):
            status = 401  # LiteLLM says 500 for a key the SDK refused to send
        hint = {401: "the API key was refused or is missing", 403: "the API key has no permission for this model",
                404: "the model name or api_base is wrong (not found)"}.get(status, "the judge is not reachable")
        variable = self.key_variable()
        if variable is None:
            key = "key: the provider's own credentials"
        else:
            key = f"key variable {variable} is {'set' if os.environ.get(variable) else 'NOT set'}"
            if not os.environ.get(variable) and self.model.startswith(("openai/", "hosted_vllm/")) and self.api_base:
                key += " (needed only if this server asks for a key)"
        detail = shown_error(f"{type(error).__name__}: {first_lines(error)}")
        return JudgeConfigurationError(
            f"judge model {self.model!r} at api_base={self.api_base or '(provider default)'} cannot be used: {hint} "
            f"{f'(HTTP {status})' if status is not None else '(no connection)'}; {key}. {detail}"
        )

    # ------------------------------------------------------------------------------------------ identity
    def config(self) -> dict[str, Any]:
        """Settings to save with a checkpoint or model card: everything but credentials (never stored)."""
        return {**{name: getattr(self, name) for name in CLIENT_SETTINGS}, **self.litellm_kwargs}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if v is not None)
        return f"LiteLLMJudge({shown})"

    def __getstate__(self) -> dict[str, Any]:
        # Runtime objects cannot cross a pickle/deepcopy; they are rebuilt (stats start afresh).
        runtime = {"stats", "_cache", "_cache_writer", "_claims", "_semaphore", "_semaphore_loop", "_rng",
                   "_transport", "_cache_params", "_limiter", "_inflight", "process_concurrency", "_claim_slots",
                   "longest_wait_seconds"}
        return {k: v for k, v in self.__dict__.items() if k not in runtime}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # ------------------------------------------------------------------------------------- event loop
    def run(self, coroutine_factory: Callable[[], Any]) -> Any:
        """Run `coroutine_factory()` on the judges' background loop and wait for it (the synchronous facade)."""
        return shared_loop.run_blocking(coroutine_factory)

    def close(self) -> None:
        """Close this judge's connections (the shared loop keeps serving other judges; a later request reconnects)."""
        shared_loop.close_soon(self._transport)

    def __enter__(self) -> LiteLLMJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------- budget
    def spent(self) -> dict[str, float]:
        """What this process's judge has used so far: cost in USD (priced answers only); tokens (an estimate for
        answers whose server reported no usage); answers with usage but no price; answers without usage."""
        stats = self.stats  # counters only: `snapshot()` would sort the latencies on every check
        return {"cost_usd": stats.cost, "tokens": stats.prompt_tokens + stats.completion_tokens + stats.estimated_tokens,
                "unpriced": stats.cost_unknown - stats.usage_unknown, "usage_unknown": stats.usage_unknown}

    def budget_exhausted(self, cost_usd: float | None = None, tokens: float | None = None,
                         unpriced: float | None = None, usage_unknown: float | None = None) -> str | None:
        """Why the budget is spent (None while it is not), for the given totals (default: this process's)."""
        spent = self.spent()
        cost_usd = spent["cost_usd"] if cost_usd is None else cost_usd
        tokens = spent["tokens"] if tokens is None else tokens
        unpriced = spent["unpriced"] if unpriced is None else unpriced
        usage_unknown = spent["usage_unknown"] if usage_unknown is None else usage_unknown
        where = f"the server at {self.api_base}" if self.api_base else f"the provider of {self.model!r}"
        if self.max_total_tokens is not None and tokens >= self.max_total_tokens:
            return (f"the judge used {tokens:,.0f} tokens, reaching its budget max_total_tokens="
                    f"{self.max_total_tokens:,} (judge_max_total_tokens)"
                    + (f"; {usage_unknown:,.0f} answers carried no token usage ({where} does not report it), their "
                       "tokens are estimated from the text (~4 characters a token)" if usage_unknown else ""))
        if self.max_cost_usd is not None:
            if cost_usd >= self.max_cost_usd:
                return (f"the judge cost ${cost_usd:.4f}, reaching its budget max_cost_usd=${self.max_cost_usd:g} "
                        "(judge_max_cost_usd)")
            if usage_unknown:  # no token counts, so nothing to price: not a gap in LiteLLM's price table
                return (f"{usage_unknown:,.0f} judge answers carried no token usage ({where} does not report it), so "
                        "a cost budget (judge_max_cost_usd) cannot be kept: set a token budget "
                        "(judge_max_total_tokens) instead, which counts such answers by an estimate from their text, "
                        "or use a server that reports usage")
            if unpriced:
                return (f"{unpriced:,.0f} judge answers could not be priced (LiteLLM has no price for model "
                        f"{self.model!r}), so a cost budget (judge_max_cost_usd) cannot be kept: set a token budget "
                        "(judge_max_total_tokens) instead, or register the model's price with litellm.register_model")
        return None

    # ------------------------------------------------------------------------------------------ probe
    def probe(self) -> str | None:
        """Send one tiny request (not cached, not in `stats`) to check that the judge can answer at all.

        Raises `JudgeConfigurationError` when it never will: the key is refused or missing (401/403), the model
        or URL is not found (404), or nothing listens at `api_base` (connection refused, unknown host). A
        transient failure (429, 5xx, timeout) or an odd answer only logs a warning and returns its description;
        None means the judge answered."""
        import_litellm()
        transport = TRANSPORTS[self.transport](self.model, self.api_base, self.timeout, self.api_key_env,
                                               {**self._transport_kwargs(), "max_tokens": PROBE_MAX_TOKENS},
                                               max_response_bytes=self.max_response_bytes)
        messages = [{"role": "user", "content": "Reply with the word OK."}]

        async def ask():
            try:
                return await transport.send(messages, 0.0)
            finally:
                await transport.aclose()

        try:
            shared_loop.run_blocking(ask)
        except Exception as error:  # noqa: BLE001 - sorted below; bugs re-raise in classify
            if is_connection_refused(error):
                raise self._configuration_error(error) from None
            if classify(error) == "fatal":
                raise self._configuration_error(error) from None
            problem = shown_error(f"{type(error).__name__}: {first_lines(error)}")
            logger.warning("judge probe of %r at %s failed (training continues; requests will be retried): %s",
                           self.model, self.api_base or "the provider", problem)
            return problem
        return None
