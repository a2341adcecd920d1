"""How one judge attempt travels: through `litellm.acompletion` (any provider), or straight to an
OpenAI-compatible `/chat/completions` endpoint with aiohttp (`openai_http`).

LiteLLM costs a few milliseconds of CPU per request (logging objects, pydantic responses, cost lookups). Against a
remote API that is noise; against a local vLLM/SGLang server answering in ~100 ms at 64-way concurrency it is the
bottleneck, since the event loop is one thread. `openai_http` sends the same request body through one
`aiohttp.ClientSession` per event loop (keep-alive pool of at most `max_concurrency` connections) and still prices
answers with LiteLLM's cost table. It does not follow redirects (a 3xx answer fails the item like a 400: point
api_base at the server itself) and ignores proxy variables. Both transports raise on failure and leave retrying
to the client; both return a `Reply`. An answer larger than `max_response_bytes` (decoded) fails its attempt
(`ResponseTooLargeError`): `openai_http` stops reading at the cap, LiteLLM can only refuse the text it returns
(it has downloaded the body by then). Usage fields are accounting: a reply whose token counts are not numbers is
still an answer (`usage_known=False`), never an error.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ppm_trl.judge.errors import (
    HTTPStatusError,
    MalformedReplyError,
    ProtocolError,
    ResponseTooLargeError,
)

# Arguments that change where/how a request travels but not the answer (not in the cache key or the body).
TRANSPORT_ARGUMENTS = {"api_base", "base_url", "api_version", "timeout", "num_retries", "max_retries", "extra_headers"}
# Default key variable per OpenAI-compatible provider prefix (as LiteLLM reads them).
_OPENAI_COMPATIBLE = {"openai": "OPENAI_API_KEY", "hosted_vllm": "HOSTED_VLLM_API_KEY"}


@dataclass
class Reply:
    text: str | None  # None when the answer carries no text (e.g. only tool calls)
    prompt_tokens: int
    completion_tokens: int
    cost: float | None  # None when LiteLLM has no price for the model, or the usage is unknown
    usage_known: bool = True  # False when the server's token counts were missing or not numbers (counted as 0)
    headers: dict[str, str] | None = None  # the answer's HTTP headers when the transport sees them (rate limits)


def token_counts(prompt_tokens: Any, completion_tokens: Any) -> tuple[int, int, bool]:
    """(prompt, completion, known): a server's usage fields as token counts, the one rule of both transports.
    Anything but two non-negative whole numbers (None, "n/a", nested junk, NaN, True) is unknown usage, counted as 0
    tokens: accounting, never fatal. So is 0 prompt tokens: a request with a prompt always has some (`{0, 0}` is
    what a server, or LiteLLM, reports when it counted nothing) — budgets then count an estimate instead."""
    counts = []
    for value in (prompt_tokens, completion_tokens):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0, 0, False
        if not (math.isfinite(value) and value >= 0 and value == int(value)):
            return 0, 0, False
        counts.append(int(value))
    if counts[0] == 0:
        return 0, 0, False
    return counts[0], counts[1], True


def checked_cost(value: Any) -> float | None:
    """A price as dollars, or None (unpriced): a price table that says NaN, infinity or a negative amount is not
    believed — it would switch the cost budget off or print `$nan`."""
    try:
        cost = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return cost if math.isfinite(cost) and cost >= 0 else None


DEFAULT_MAX_RESPONSE_BYTES = 4 * 2**20  # ~1M tokens of text: far above any judge answer, far below a decompression bomb
_ERROR_BODY_BYTES = 64 * 2**10  # what is read of a non-2xx answer (its message is shortened to 2,000 characters anyway)


def check_max_response_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
        raise ValueError(f"max_response_bytes must be an integer >= 1024 (bytes of a decoded judge answer), got {value!r}")
    return value


def import_litellm():
    # LiteLLM's bundled price table, not a download at every import (three tries and four warning lines, ~10 s,
    # on every command without network; and a remote table is one more thing that can lie). Set the variable to
    # "False" to have LiteLLM fetch the newest table.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # lazy: `import ppm_trl.judge` must stay light

    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner per failed attempt
    return litellm


class _Pricing:
    """LiteLLM's price for an answer; after one failed lookup the model is known to be unpriced."""

    def __init__(self, model: str):
        self.model = model
        self.known = True

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if not self.known:
            return None
        litellm = import_litellm()
        try:
            # Priced by the configured model: a proxy that names another model in its answer bills at our price.
            prompt_cost, completion_cost = litellm.cost_per_token(
                model=self.model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            )
            return checked_cost(prompt_cost + completion_cost)
        except Exception:  # LiteLLM raises for models it has no price for
            self.known = False
            return None


class LiteLLMTransport:
    """Through `litellm.acompletion`. LiteLLM (httpx) reads and decodes the whole body before it returns, so
    `max_response_bytes` can only refuse an answer whose text is longer than the cap (UTF-8 bytes): it bounds what
    the judge parses, logs and caches, not the download. Use `openai_http` with a server you do not control."""

    def __init__(self, model: str, api_base: str | None, timeout: float, api_key_env: str | None, kwargs: dict,
                 max_concurrency: int = 64,  # LiteLLM pools connections itself; the judge's semaphore bounds them
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        self.model, self.api_base, self.timeout, self.api_key_env, self.kwargs = model, api_base, timeout, api_key_env, kwargs
        self.max_response_bytes = check_max_response_bytes(max_response_bytes)
        self.pricing = _Pricing(model)
        provider = model.partition("/")[0]
        self.guarded = None  # LiteLLM's clients follow redirects: an api_base server gets a client that does not
        if api_base and provider in ("openai", "hosted_vllm") and "client" not in kwargs:
            from ppm_trl.judge.litellm_http import GuardedClients  # imports httpx: only for such a judge

            self.guarded = GuardedClients(provider, api_base, timeout, self.max_response_bytes)

    async def send(self, messages: list[dict[str, str]], temperature: float) -> Reply:
        litellm = import_litellm()
        arguments = dict(self.kwargs)
        arguments.update(model=self.model, messages=messages, temperature=temperature, timeout=self.timeout,
                         num_retries=0, max_retries=0)  # retries are the client's, so its counts are exact
        if self.api_base is not None:
            arguments["api_base"] = self.api_base
        if self.api_key_env is not None:
            arguments["api_key"] = os.environ[self.api_key_env]
        if self.guarded is not None:
            key = arguments.get("api_key") or os.environ.get(_OPENAI_COMPATIBLE[self.model.partition("/")[0]])
            arguments["client"] = self.guarded.client(key)
        response = await asyncio.wait_for(litellm.acompletion(**arguments), self.timeout)
        usage = getattr(response, "usage", None)
        prompt_tokens, completion_tokens, usage_known = token_counts(
            getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
        )
        cost = self.pricing.cost(prompt_tokens, completion_tokens) if usage_known else None
        try:
            text = response.choices[0].message.content
        except (AttributeError, IndexError, TypeError):
            text = None
        # A character is at least one UTF-8 byte and at most four: only a text near the cap needs encoding.
        if isinstance(text, str) and len(text) > self.max_response_bytes // 4 and (
                len(text) > self.max_response_bytes or len(text.encode("utf-8", "surrogatepass")) > self.max_response_bytes):
            raise ResponseTooLargeError("the answer's text", self.max_response_bytes)
        headers = (getattr(response, "_hidden_params", None) or {}).get("additional_headers")
        return Reply(text if isinstance(text, str) else None, prompt_tokens, completion_tokens, cost, usage_known,
                     dict(headers) if isinstance(headers, Mapping) else None)

    async def aclose(self) -> None:
        return None


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # a legal header name (RFC 9110 token)
_FRAMING_HEADERS = {"content-length", "transfer-encoding", "connection", "host"}  # aiohttp's to set


def checked_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """`extra_headers` as str → str, refusing names and values that would break or smuggle into the request."""
    out = {}
    for name, value in headers.items():
        name, value = str(name), str(value)
        if not _TOKEN.match(name) or name.lower() in _FRAMING_HEADERS:
            raise ValueError(f"extra_headers: header name {name!r} is not allowed")
        if any(character in value for character in "\r\n\0"):  # the value may be a key: never quote it
            raise ValueError(f"extra_headers: the value of header {name!r} contains a line break or NUL")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"extra_headers: the value of header {name!r} is not latin-1 text") from None
        out[name] = value
    return out


class OpenAIHTTPTransport:
    def __init__(self, model: str, api_base: str | None, timeout: float, api_key_env: str | None, kwargs: dict,
                 max_concurrency: int = 64, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        provider, _, name = model.partition("/")
        if provider not in _OPENAI_COMPATIBLE or not name:
            raise ValueError(
                f"transport='openai_http' needs an OpenAI-compatible model string "
                f"({', '.join(p + '/<name>' for p in _OPENAI_COMPATIBLE)}), got {model!r}"
            )
        if not api_base:
            raise ValueError("transport='openai_http' needs api_base, e.g. 'http://127.0.0.1:8000/v1'")
        parts = urlsplit(api_base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"transport='openai_http' needs an http:// or https:// api_base, got {api_base!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError("credentials in api_base are refused: the API key comes from the environment")
        self.url = api_base.rstrip("/") + "/chat/completions"
        self.name, self.timeout, self.max_concurrency = name, timeout, max_concurrency
        self.max_response_bytes = check_max_response_bytes(max_response_bytes)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"} | checked_headers(
            kwargs.get("extra_headers") or {}
        )
        self.kwargs = {k: v for k, v in kwargs.items() if k not in TRANSPORT_ARGUMENTS}
        self.key_variable = api_key_env or _OPENAI_COMPATIBLE[provider]
        self.pricing = _Pricing(model)
        self._session = None  # one aiohttp.ClientSession per event loop (a forked child's loop gets its own)
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _open_session(self, loop: asyncio.AbstractEventLoop):
        import aiohttp  # lazy: `import ppm_trl.judge` must stay light

        self._aiohttp = aiohttp
        self._session_loop = loop
        self._timeout = aiohttp.ClientTimeout(total=self.timeout)  # connect, send and the whole answer
        # The TLS context is made now, not at aiohttp's import, so SSL_CERT_FILE (a private CA) is honoured.
        connector = aiohttp.TCPConnector(
            limit=self.max_concurrency, ssl=ssl.create_default_context() if self.url.startswith("https") else False
        )
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self.headers, cookie_jar=aiohttp.DummyCookieJar(), timeout=self._timeout
        )
        return self._session

    async def send(self, messages: list[dict[str, str]], temperature: float) -> Reply:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._session_loop is not loop:
            session = self._open_session(loop)
        payload = {"model": self.name, "messages": messages, "temperature": temperature, **self.kwargs}
        key = os.environ.get(self.key_variable)  # read per request, never stored
        try:
            async with session.post(
                self.url, data=json.dumps(payload).encode(), allow_redirects=False,  # api_base must name the server
                headers={"Authorization": f"Bearer {key}"} if key else None,
            ) as response:
                status, headers = response.status, response.headers
                body = await self._read_capped(response, status)
        except self._aiohttp.ClientResponseError as error:  # unparseable answer; its repr shows the request's headers
            raise ProtocolError(f"malformed HTTP answer from {self.url}: {error.message}") from None
        if 300 <= status < 400:  # the request (a rollout) would go to another server, and its answer be the grade
            raise HTTPStatusError(status, dict(headers), f"the judge server answered {status} redirecting to "
                                  f"{headers.get('Location', '(none)')!r}; redirects are not followed: point api_base "
                                  "at the server itself")
        if status >= 300:
            raise HTTPStatusError(status, dict(headers), body.decode("utf-8", "replace"))
        reply = self._reply(body)
        reply.headers = dict(headers)
        return reply

    async def _read_capped(self, response, status: int) -> bytes:
        """The decoded body, read chunk by chunk: a 2xx body over `max_response_bytes` fails the attempt
        (`ResponseTooLargeError`) as soon as the cap is passed — aiohttp inflates gzip/deflate/br incrementally, so
        a decompression bomb costs at most the cap; an error body is cut at 64 KiB (only its start is shown)."""
        limit = self.max_response_bytes if status < 300 else min(self.max_response_bytes, _ERROR_BODY_BYTES)
        declared = response.content_length  # the encoded size, when the server says it
        if status < 300 and declared is not None and declared > limit:
            raise ResponseTooLargeError(f"the answer from {self.url} (Content-Length {declared:,})", limit)
        chunks, size = [], 0
        async for chunk in response.content.iter_chunked(64 * 2**10):
            size += len(chunk)
            if size > limit:
                if status >= 300:
                    chunks.append(chunk[: len(chunk) - (size - limit)])
                    break
                raise ResponseTooLargeError(f"the answer from {self.url}", limit)
            chunks.append(chunk)
        return b"".join(chunks)

    def _reply(self, body: bytes) -> Reply:
        try:
            data = json.loads(body)
        except Exception as error:  # noqa: BLE001 - not JSON, not UTF-8, nested past the recursion limit: one bad answer
            raise MalformedReplyError(f"answer is not JSON ({type(error).__name__}): {body[:120]!r}") from None
        if not isinstance(data, dict):
            raise MalformedReplyError(f"answer is not a chat completion object: {body[:120]!r}")
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        prompt_tokens, completion_tokens, usage_known = token_counts(
            usage.get("prompt_tokens"), usage.get("completion_tokens")
        )
        try:
            text = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            text = None
        cost = self.pricing.cost(prompt_tokens, completion_tokens) if usage_known else None
        return Reply(text if isinstance(text, str) else None, prompt_tokens, completion_tokens, cost, usage_known)

    async def aclose(self) -> None:
        if self._session is not None and self._session_loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None


TRANSPORTS = {"litellm": LiteLLMTransport, "openai_http": OpenAIHTTPTransport}
