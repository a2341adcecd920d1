"""What can go wrong with a judge attempt, and what the client does about it: the errors the transports raise, a
server's Retry-After, and `classify` — retry (transient), fail the item (e.g. a 400 for a prompt too long), or stop
(`JudgeConfigurationError`: a refused key, an unknown model, no server).

A module of its own, imported by the client and both transports (`transport.py`, `litellm_http.py`), which import
nothing of each other's but what they use.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import socket
import time

from ppm_trl.judge.limits import server_seconds

_FATAL_STATUS = {401, 403, 404}  # misconfiguration (key, permission, model name): fail loudly, do not retry
_RETRY_STATUS = {408, 409, 425, 429}  # plus every 5xx
# LiteLLM reports a key the OpenAI SDK refused before sending (none set) as a retryable 500, and a missing Gemini key
# as a connection error; Gemini answers a wrong key with HTTP 400 ("API key not valid"): each is a 401.
MISSING_KEY = re.compile(r"missing credentials|api_key client option must be set|no api key provided"
                          r"|missing \w+ api key|api key not valid|api_key_invalid", re.IGNORECASE)


class JudgeConfigurationError(RuntimeError):
    """The judge cannot work as configured (authentication, permission, unknown model): retrying will not help."""


class MalformedReplyError(Exception):
    """A 2xx answer whose body is not a chat completion (retried like a transient failure)."""


class ResponseTooLargeError(MalformedReplyError):
    """An answer larger than `max_response_bytes` once decoded (gzip/deflate/br included): the attempt fails and
    is retried like a malformed answer; nothing past the cap is read or decompressed."""

    def __init__(self, what: str, limit: int):
        super().__init__(f"{what} is larger than max_response_bytes={limit:,} (judge_max_response_bytes); raise it "
                         "if the judge's answers are legitimately that long")
        self.limit = limit


class ProtocolError(ConnectionError):
    """The server's bytes are not a well-formed HTTP answer (retried like a dropped connection)."""


class HTTPStatusError(Exception):
    """A non-2xx answer of the `openai_http` transport; `status_code` and `headers` drive the retry policy."""

    def __init__(self, status_code: int, headers: dict[str, str], body: str):
        super().__init__(f"HTTP {status_code}: {body[:2000]}")  # the client redacts, then shortens
        self.status_code = status_code
        self.headers = headers


def retry_after_seconds(error: BaseException) -> float | None:
    """The server's `retry-after-ms` / `Retry-After` (seconds or HTTP date) header of a failed attempt, if any
    (as asked: the client's back-off caps it). A value that is not a finite number >= 0 (`nan`, `inf`, `-1`) is
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


def causes(error: BaseException) -> list[BaseException]:
    """The error and what it was raised from (LiteLLM wraps the SDK's error, which wraps httpx's, ...)."""
    chain: list[BaseException] = []
    while error is not None and error not in chain and len(chain) < 16:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def is_connection_refused(error: BaseException) -> bool:
    """Nothing listens at the judge's address (refused, unknown host): retrying the next request will not help."""
    for cause in causes(error):
        if isinstance(cause, (ConnectionRefusedError, socket.gaierror)):
            return True
        if type(cause).__name__ in ("ConnectError", "ClientConnectorError") and not isinstance(cause, TimeoutError):
            return True
    return False


def first_lines(error: BaseException) -> str:
    """An error's message without the traceback LiteLLM copies into some of its messages."""
    return str(error).split("\nTraceback (most recent call last)", 1)[0].strip()


def classify(error: BaseException) -> str:
    """'retry' (transient), 'fail' (this item cannot be judged, e.g. 400 context too long) or 'fatal'."""
    if isinstance(error, (asyncio.TimeoutError, TimeoutError, ConnectionError, MalformedReplyError)):
        return "retry"
    if isinstance(error, (RecursionError, UnicodeDecodeError)):  # raised reading a pathological answer body
        return "retry"
    status = getattr(error, "status_code", None)
    module = type(error).__module__
    if not isinstance(error, HTTPStatusError) and not module.startswith(("litellm", "openai", "httpx", "aiohttp")):
        raise error  # a bug, not a judge answer: surface it
    if any(MISSING_KEY.search(str(cause)) for cause in causes(error)):
        return "fatal"  # no key: every retry would fail the same way
    if isinstance(status, int):
        if status in _FATAL_STATUS:
            return "fatal"
        if status in _RETRY_STATUS or status >= 500:
            return "retry"
        return "fail"
    return "retry"  # connection errors and other transport failures without a status

