"""The HTTP client LiteLLM uses for a judge at an `api_base` (a self-hosted OpenAI-compatible server).

LiteLLM's own clients follow redirects, so a server (or anything on the way) answering 307/308 with another origin
gets the rollout prompt POSTed there, and that origin's answer becomes the grade; and LiteLLM rejects a whole answer
whose `usage` is not token counts (a number, a list, a non-numeric total), failing every attempt. For `openai/…` and
`hosted_vllm/…` models with an `api_base` the judge hands LiteLLM its own client (`client=`, a documented
`acompletion` argument) over `GuardedTransport`: a redirect comes back as the error it is, naming its Location,
malformed `usage` is dropped (accounting is never fatal; LiteLLM then reports its own token estimate), and the
body is read decoded chunk by chunk up to `max_response_bytes` (a gzip bomb fails its attempt at the cap).
Other providers are reached at their official endpoints through LiteLLM's clients unchanged.
"""

from __future__ import annotations

import asyncio
import json
import zlib

import httpx

from ppm_trl.judge.errors import MalformedReplyError, ResponseTooLargeError

GUARDED_PROVIDERS = ("openai", "hosted_vllm")


def _token_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def usage_is_counts(usage) -> bool:
    """Whether a chat completion's `usage` is what LiteLLM accepts: absent, or an object of token counts."""
    if usage is None:
        return True
    if not isinstance(usage, dict):
        return False
    return all(_token_count(usage[name]) for name in ("prompt_tokens", "completion_tokens", "total_tokens")
               if usage.get(name) is not None)


class GuardedTransport(httpx.AsyncBaseTransport):
    """httpx transport: 3xx answers become an error naming the Location; bodies are capped; malformed `usage` is
    removed."""

    def __init__(self, max_response_bytes: int):
        self.inner = httpx.AsyncHTTPTransport()
        self.max_response_bytes = max_response_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = "gzip, deflate"
        response = await self.inner.handle_async_request(request)
        if 300 <= response.status_code < 400:
            await response.aclose()
            location = response.headers.get("location", "(none)")
            message = (f"the judge server answered {response.status_code} redirecting to {location!r}; redirects are "
                       "not followed (the request would go to another server): point api_base at the server itself")
            return httpx.Response(response.status_code, json={"error": {"message": message, "type": "redirect"}},
                                  request=request)
        body = await self._capped_body(response)
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        if response.status_code >= 300 or "json" not in response.headers.get("content-type", ""):
            return httpx.Response(response.status_code, headers=headers, content=body, request=request)
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict) or usage_is_counts(data.get("usage")):
            return httpx.Response(response.status_code, headers=headers, content=body, request=request)
        data.pop("usage")
        return httpx.Response(response.status_code, headers=headers, json=data, request=request)

    async def _capped_body(self, response: httpx.Response) -> bytes:
        """The decoded body, read chunk by chunk; `ResponseTooLargeError` past the cap. gzip/deflate are inflated
        here with a bounded output per step (httpx's own decoder inflates a whole chunk at once: a 64 KB chunk of a
        bomb is 64 MB); other encodings are refused (requests ask for gzip, deflate or none)."""
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
            await response.aclose()
            raise MalformedReplyError(f"the judge server answered with content-encoding {encoding!r} (asked: gzip, "
                                      "deflate or identity)")
        inflate = None if encoding in ("identity", "") else zlib.decompressobj(wbits=47)  # gzip or zlib header
        cap, chunks, size = self.max_response_bytes, [], 0
        try:
            async for raw in response.aiter_raw():
                while raw:
                    piece = raw if inflate is None else inflate.decompress(raw, cap + 1 - size)
                    raw = b"" if inflate is None else inflate.unconsumed_tail
                    size += len(piece)
                    if size > cap:
                        raise ResponseTooLargeError("the answer's body", cap)
                    chunks.append(piece)
        except zlib.error as error:
            raise MalformedReplyError(f"the judge server's {encoding} body does not decode: {error}") from None
        finally:
            await response.aclose()
        return b"".join(chunks)

    async def aclose(self) -> None:
        await self.inner.aclose()


class GuardedClients:
    """One guarded client per event loop (httpx clients belong to the loop they were made on)."""

    def __init__(self, provider: str, api_base: str, timeout: float, max_response_bytes: int):
        self.provider, self.api_base, self.timeout = provider, api_base, timeout
        self.max_response_bytes = max_response_bytes
        self._client, self._loop = None, None

    def client(self, api_key: str | None):
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            transport = GuardedTransport(self.max_response_bytes)
            http = httpx.AsyncClient(transport=transport, follow_redirects=False, timeout=self.timeout)
            if self.provider == "openai":
                import openai

                self._client = openai.AsyncOpenAI(base_url=self.api_base, api_key="unset", max_retries=0,
                                                  timeout=self.timeout, http_client=http)
            else:
                from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

                self._client = AsyncHTTPHandler(timeout=self.timeout, transport=transport, follow_redirects=False)
            self._loop = loop
        if self.provider == "openai":  # the key is read per request and never kept on the shared client
            return self._client.with_options(api_key=api_key or "unset")
        return self._client
