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
import email.utils
import logging
import math
import os
import random
import re
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ppm_trl.judge import loop as shared_loop
from ppm_trl.judge.cache import CacheWriter, ResponseCache, request_fingerprint, request_key
from ppm_trl.judge.claims import KeyClaims
from ppm_trl.judge.limits import (
    RateLimiter,
    clamped_usage,
    estimate_tokens,
    exhausted_for,
    longest_wait_seconds,
    process_count,
    process_share,
    server_seconds,
    usage_bounds,
    used_tokens_estimate,
)
from ppm_trl.judge.stats import JudgeStats
from ppm_trl.judge.tasks import REQUEST_ERROR, UNREADABLE, JudgeFailure, JudgeTasks, Parser, with_nonce
from ppm_trl.judge.transport import (
    DEFAULT_MAX_RESPONSE_BYTES,
    TRANSPORT_ARGUMENTS,
    TRANSPORTS,
    HTTPStatusError,
    MalformedReplyError,
    check_max_response_bytes,
    import_litellm,
)

logger = logging.getLogger(__name__)


# Arguments that look like credentials are refused: keys come from the environment only.
_CREDENTIAL_ARGUMENT = re.compile(r"key|secret|password|credential|session_token", re.IGNORECASE)
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|cookie", re.IGNORECASE)
_FATAL_STATUS = {401, 403, 404}  # misconfiguration (key, permission, model name): fail loudly, do not retry
_RETRY_STATUS = {408, 409, 425, 429}  # plus every 5xx
# LiteLLM reports a key the OpenAI SDK refused before sending (none set) as a retryable 500, and a missing Gemini key
# as a connection error; Gemini answers a wrong key with HTTP 400 ("API key not valid"): each is a 401.
_MISSING_KEY = re.compile(r"missing credentials|api_key client option must be set|no api key provided"
                          r"|missing \w+ api key|api key not valid|api_key_invalid", re.IGNORECASE)
# Providers whose key variable LiteLLM reads; others: `<PROVIDER>_API_KEY`.
_KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "hosted_vllm": "HOSTED_VLLM_API_KEY", "gemini": "GEMINI_API_KEY",
                  "anthropic": "ANTHROPIC_API_KEY", "openrouter": "OPENROUTER_API_KEY", "azure": "AZURE_API_KEY"}
# LiteLLM's `openai/` client refuses to send without a key even to a local server that needs none.
_NO_KEY_NEEDED = "sk-no-key-needed"
PROBE_MAX_TOKENS = 8


class JudgeConfigurationError(RuntimeError):
    """The judge cannot work as configured (authentication, permission, unknown model): retrying will not help."""


_CREDENTIAL_VARIABLE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CRED", re.IGNORECASE)
# A credential header as a server may echo it: `Authorization: Bearer x`, JSON `"api-key": "x"`, repr `'x-api-key': 'x'`.
_CREDENTIAL_HEADER_VALUE = re.compile(
    r"""(\b(?:proxy-)?authorization|\b(?:x-)?api[-_]key)(["']?\s*[:=]\s*["']?)((?:bearer|basic|token)\s+)?[^\s"',;}\]]+""",
    re.IGNORECASE,
)
_BEARER = re.compile(r"""\b(bearer\s+)[^\s"',;}\]]+""", re.IGNORECASE)
_key_variables: set[str] = set()  # names (never values) of the key variables judges were configured with


def redact(text: str) -> str:
    """Mask credentials in a message the judge logs or raises: the value of every key variable a judge was given
    (`api_key_env`, any name), of every credential-looking environment variable (…KEY, …TOKEN, …SECRET, …CRED),
    and any Authorization / api-key / x-api-key header value or bearer token (a server may echo them back)."""
    for name, value in os.environ.items():
        if value and value in text and (
            (name in _key_variables and len(value) >= 4) or (len(value) >= 8 and _CREDENTIAL_VARIABLE.search(name))
        ):
            text = text.replace(value, "***")
    text = _CREDENTIAL_HEADER_VALUE.sub(lambda match: f"{match[1]}{match[2]}{match[3] or ''}***", text)
    return _BEARER.sub(r"\1***", text)


def printable(text: str) -> str:
    """`text` as one line a terminal shows but never acts on: control characters (escape sequences' ESC, line
    breaks that could forge a `ppm-trl prepare:` line, tabs), bidi overrides and other non-printable characters
    are written as their Python escapes (`\\x1b`, `\\n`, `\\u202e`). For judge error text from a server."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown_error(text: str, limit: int = 300) -> str:
    """Judge error text as logged, raised and printed: credentials masked, cut to `limit`, printable."""
    return printable(redact(text)[:limit])


def api_base_credentials(api_base: str) -> str | None:
    """What in `api_base` is a credential (`user:password@`, a `?key=` / `?api_key=` / `?token=` parameter), or
    None. Refused rather than redacted: api_base goes into every cache entry's fingerprint, `config()`, `repr`, the
    model card and error messages, and the key has a place of its own (the environment)."""
    try:
        parts = urlsplit(api_base)
    except ValueError:
        return None  # not a URL at all: the transport says so
    if parts.username is not None or parts.password is not None:
        return "a user:password@ part"
    names = sorted({name for name, _ in parse_qsl(parts.query, keep_blank_values=True)
                    if _CREDENTIAL_ARGUMENT.search(name) or name.lower() in ("token", "access_token", "sig")})
    return f"query parameter(s) {names}" if names else None


def _retry_after_seconds(error: BaseException) -> float | None:
    """The server's `retry-after-ms` / `Retry-After` (seconds or HTTP date) header of a failed attempt, if any
    (as asked: `LiteLLMJudge._backoff` caps it). A value that is not a finite number >= 0 (`nan`, `inf`, `-1`) is
    no value: `nan` would pass every `min()` cap."""
    headers = (
        getattr(error, "litellm_response_headers", None)
        or getattr(error, "headers", None)
        or getattr(getattr(error, "response", None), "headers", None)
    )
    if not headers:
        return None
    try:
        lowered = {str(k).lower(): str(v) for k, v in dict(headers).items()}
    except (TypeError, ValueError):
        return None
    if server_seconds(lowered.get("retry-after-ms"), 0.001) is not None:
        return server_seconds(lowered["retry-after-ms"], 0.001)
    value = lowered.get("retry-after")
    if value is None or server_seconds(value) is not None:
        return server_seconds(value)
    try:  # an HTTP date; one in the past means "now"
        return max(email.utils.parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def _causes(error: BaseException) -> list[BaseException]:
    """The error and what it was raised from (LiteLLM wraps the SDK's error, which wraps httpx's, ...)."""
    chain: list[BaseException] = []
    while error is not None and error not in chain and len(chain) < 16:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def is_connection_refused(error: BaseException) -> bool:
    """Nothing listens at the judge's address (refused, unknown host): retrying the next request will not help."""
    for cause in _causes(error):
        if isinstance(cause, (ConnectionRefusedError, socket.gaierror)):
            return True
        if type(cause).__name__ in ("ConnectError", "ClientConnectorError") and not isinstance(cause, TimeoutError):
            return True
    return False


def _first_lines(error: BaseException) -> str:
    """An error's message without the traceback LiteLLM copies into some of its messages."""
    return str(error).split("\nTraceback (most recent call last)", 1)[0].strip()


def _classify(error: BaseException) -> str:
    """'retry' (transient), 'fail' (this item cannot be judged, e.g. 400 context too long) or 'fatal'."""
    if isinstance(error, (asyncio.TimeoutError, TimeoutError, ConnectionError, MalformedReplyError)):
        return "retry"
    status = getattr(error, "status_code", None)
    module = type(error).__module__
    if not isinstance(error, HTTPStatusError) and not module.startswith(("litellm", "openai", "httpx", "aiohttp")):
        raise error  # a bug, not a judge answer: surface it
    if any(_MISSING_KEY.search(str(cause)) for cause in _causes(error)):
        return "fatal"  # no key: every retry would fail the same way
    if isinstance(status, int):
        if status in _FATAL_STATUS:
            return "fatal"
        if status in _RETRY_STATUS or status >= 500:
            return "retry"
        return "fail"
    return "retry"  # connection errors and other transport failures without a status


class LiteLLMJudge(JudgeTasks):
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
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"model must be a LiteLLM model string such as 'openai/gpt-4o-mini', got {model!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if isinstance(num_retries, bool) or not isinstance(num_retries, int) or num_retries < 0:
            raise ValueError(f"num_retries must be an integer >= 0, got {num_retries!r}")
        for name, value in (("max_rpm", max_rpm), ("max_tpm", max_tpm), ("max_cost_usd", max_cost_usd),
                            ("max_total_tokens", max_total_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                                      not value > 0 or not math.isfinite(value)):
                raise ValueError(f"{name} must be a number > 0 (or None: unlimited), got {value!r}")
        if not (isinstance(burst_seconds, (int, float)) and burst_seconds > 0):
            raise ValueError(f"burst_seconds must be > 0, got {burst_seconds!r}")
        if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 1):
            raise ValueError(f"processes must be an integer >= 1 (or None: WORLD_SIZE), got {processes!r}")
        if backoff_base < 0 or backoff_max < 0:
            raise ValueError(f"backoff_base and backoff_max must be >= 0, got {backoff_base!r}, {backoff_max!r}")
        refused = sorted(name for name in litellm_kwargs if _CREDENTIAL_ARGUMENT.search(name))
        refused += sorted(f"extra_headers[{header!r}]" for header in (litellm_kwargs.get("extra_headers") or {})
                          if _CREDENTIAL_HEADER.search(str(header)))
        if refused:
            raise ValueError(
                f"credential argument(s) {refused} refused: API keys come from the environment only. Set the "
                "provider's variable (OPENAI_API_KEY, GEMINI_API_KEY, ...) or name one with api_key_env='MY_KEY'."
            )
        if api_base is not None and not isinstance(api_base, str):
            raise ValueError(f"api_base must be a URL string such as 'http://127.0.0.1:8000/v1', got {api_base!r}")
        credentials = None if api_base is None else api_base_credentials(api_base)
        if credentials is not None:  # the URL is not shown: it holds the secret
            raise ValueError(
                f"api_base carries credentials ({credentials}) and is refused: it would be written into every judge "
                "cache entry, config(), logs and errors. Give the URL without them and put the key in the environment "
                "(the provider's variable, e.g. OPENAI_API_KEY, or one named by api_key_env).")
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise ValueError(f"api_key_env={api_key_env!r} names an environment variable that is not set")
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; accepted: {sorted(TRANSPORTS)}")
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
        self.max_response_bytes = check_max_response_bytes(max_response_bytes)
        if not isinstance(echo_nonce, bool):
            raise ValueError(f"echo_nonce must be True or False, got {echo_nonce!r}")
        self.echo_nonce = echo_nonce
        self.litellm_kwargs = dict(litellm_kwargs)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.stats = JudgeStats()
        processes = self.processes or process_count()
        self.process_concurrency = max(1, self.max_concurrency // processes)
        self._inflight: dict[str, asyncio.Future] = {}  # key -> the answer of a request being sent by any batch
        if self.api_key_env is not None:
            _key_variables.add(self.api_key_env)  # so that `redact` masks its value whatever its name
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
        if any(_MISSING_KEY.search(str(c)) for c in _causes(error)):
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
        detail = shown_error(f"{type(error).__name__}: {_first_lines(error)}")
        return JudgeConfigurationError(
            f"judge model {self.model!r} at api_base={self.api_base or '(provider default)'} cannot be used: {hint} "
            f"{f'(HTTP {status})' if status is not None else '(no connection)'}; {key}. {detail}"
        )

    # ------------------------------------------------------------------------------------------ identity
    def config(self) -> dict[str, Any]:
        """Settings to save with a checkpoint or model card: everything but credentials (never stored)."""
        return {
            "model": self.model,
            "api_base": self.api_base,
            "max_concurrency": self.max_concurrency,
            "timeout": self.timeout,
            "num_retries": self.num_retries,
            "temperature": self.temperature,
            "cache_dir": self.cache_dir,
            "api_key_env": self.api_key_env,
            "transport": self.transport,
            "max_rpm": self.max_rpm,
            "max_tpm": self.max_tpm,
            "max_cost_usd": self.max_cost_usd,
            "max_total_tokens": self.max_total_tokens,
            "max_response_bytes": self.max_response_bytes,
            "echo_nonce": self.echo_nonce,
            **self.litellm_kwargs,
        }

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
        return None if entry is None else parse(entry["content"])

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
                    retry_after = _retry_after_seconds(caught)
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
                verdict = _classify(error)
                if verdict == "fatal":
                    raise self._configuration_error(error) from None
                if verdict == "fail" or attempt == self.num_retries:
                    status = getattr(error, "status_code", None)
                    reason = (f"{type(error).__name__}{f' (HTTP {status})' if status else ''}: "
                              f"{shown_error(_first_lines(error)) or f'no answer within {self.timeout:g} s'}")
                    return self._give_up(started, attempt + 1, reason, REQUEST_ERROR)
                await asyncio.sleep(self._backoff(attempt, _retry_after_seconds(error)))
                continue
            self._account(reply, messages)
            parsed = None if reply.text is None else parse(reply.text)
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
        except Exception as error:  # noqa: BLE001 - sorted below; bugs re-raise in _classify
            if is_connection_refused(error):
                raise self._configuration_error(error) from None
            if _classify(error) == "fatal":
                raise self._configuration_error(error) from None
            problem = shown_error(f"{type(error).__name__}: {_first_lines(error)}")
            logger.warning("judge probe of %r at %s failed (training continues; requests will be retried): %s",
                           self.model, self.api_base or "the provider", problem)
            return problem
        return None

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
