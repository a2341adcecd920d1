"""How one judge attempt travels: through `litellm.acompletion` (any provider), or straight to an
OpenAI-compatible `/chat/completions` endpoint over a pool of keep-alive connections (`openai_http`, see `http.py`).

LiteLLM costs a few milliseconds of CPU per request (logging objects, pydantic responses, cost lookups). Against a
remote API that is noise; against a local vLLM/SGLang server answering in ~100 ms at 64-way concurrency it is the
bottleneck, since the event loop is one thread. `openai_http` sends the same request body without that overhead
and still prices answers with LiteLLM's cost table. It does not follow redirects (a 3xx answer fails the item
like a 400: point api_base at the server itself). Both transports raise on failure and leave retrying to the
client; both return a `Reply`.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

from ppm_trl.judge import http

# Arguments that change where/how a request travels but not the answer (not in the cache key or the body).
TRANSPORT_ARGUMENTS = {"api_base", "base_url", "api_version", "timeout", "num_retries", "max_retries", "extra_headers"}
# Default key variable per OpenAI-compatible provider prefix (as LiteLLM reads them).
_OPENAI_COMPATIBLE = {"openai": "OPENAI_API_KEY", "hosted_vllm": "HOSTED_VLLM_API_KEY"}


@dataclass
class Reply:
    text: str | None  # None when the answer carries no text (e.g. only tool calls)
    prompt_tokens: int
    completion_tokens: int
    cost: float | None  # None when LiteLLM has no price for the model


class MalformedReplyError(Exception):
    """A 2xx answer whose body is not a chat completion (retried like a transient failure)."""


class HTTPStatusError(Exception):
    """A non-2xx answer of the `openai_http` transport; `status_code` and `headers` drive the retry policy."""

    def __init__(self, status_code: int, headers: dict[str, str], body: str):
        super().__init__(f"HTTP {status_code}: {body[:200]}")
        self.status_code = status_code
        self.headers = headers


def import_litellm():
    import litellm  # lazy: `import ppm_trl.judge` must stay light

    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner per failed attempt
    return litellm


class _Pricing:
    """LiteLLM's price for an answer; after one failed lookup the model is known to be unpriced."""

    def __init__(self, model: str):
        self.model = model
        self.known = True

    def cost(self, prompt_tokens: int, completion_tokens: int, response: Any = None) -> float | None:
        if not self.known:
            return None
        litellm = import_litellm()
        try:
            if response is not None:
                return float(litellm.completion_cost(completion_response=response))
            prompt_cost, completion_cost = litellm.cost_per_token(
                model=self.model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            )
            return float(prompt_cost + completion_cost)
        except Exception:  # LiteLLM raises for models it has no price for
            self.known = False
            return None


class LiteLLMTransport:
    def __init__(self, model: str, api_base: str | None, timeout: float, api_key_env: str | None, kwargs: dict):
        self.model, self.api_base, self.timeout, self.api_key_env, self.kwargs = model, api_base, timeout, api_key_env, kwargs
        self.pricing = _Pricing(model)

    async def send(self, messages: list[dict[str, str]], temperature: float) -> Reply:
        litellm = import_litellm()
        arguments = dict(self.kwargs)
        arguments.update(model=self.model, messages=messages, temperature=temperature, timeout=self.timeout,
                         num_retries=0, max_retries=0)  # retries are the client's, so its counts are exact
        if self.api_base is not None:
            arguments["api_base"] = self.api_base
        if self.api_key_env is not None:
            arguments["api_key"] = os.environ[self.api_key_env]
        response = await asyncio.wait_for(litellm.acompletion(**arguments), self.timeout)
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
        if cost is None:
            cost = self.pricing.cost(prompt_tokens, completion_tokens, response)
        try:
            text = response.choices[0].message.content
        except (AttributeError, IndexError, TypeError):
            text = None
        return Reply(text if isinstance(text, str) else None, prompt_tokens, completion_tokens, cost)

    async def aclose(self) -> None:
        return None


class OpenAIHTTPTransport:
    def __init__(self, model: str, api_base: str | None, timeout: float, api_key_env: str | None, kwargs: dict):
        provider, _, name = model.partition("/")
        if provider not in _OPENAI_COMPATIBLE or not name:
            raise ValueError(
                f"transport='openai_http' needs an OpenAI-compatible model string "
                f"({', '.join(p + '/<name>' for p in _OPENAI_COMPATIBLE)}), got {model!r}"
            )
        if not api_base:
            raise ValueError("transport='openai_http' needs api_base, e.g. 'http://127.0.0.1:8000/v1'")
        self.url = api_base.rstrip("/") + "/chat/completions"
        self.name, self.timeout = name, timeout
        self.extra_headers = dict(kwargs.get("extra_headers") or {})
        self.kwargs = {k: v for k, v in kwargs.items() if k not in TRANSPORT_ARGUMENTS}
        self.key_variable = api_key_env or _OPENAI_COMPATIBLE[provider]
        self.pricing = _Pricing(model)
        self._pool = http.ConnectionPool(self.url, self.extra_headers)  # refuses a bad URL or header now

    async def send(self, messages: list[dict[str, str]], temperature: float) -> Reply:
        payload = {"model": self.name, "messages": messages, "temperature": temperature, **self.kwargs}
        key = os.environ.get(self.key_variable)  # read per request, never stored
        response = await self._pool.post(
            json.dumps(payload).encode(), self.timeout, {"Authorization": f"Bearer {key}"} if key else None
        )
        if response.status >= 300:  # redirects are not followed: api_base must name the server itself
            raise HTTPStatusError(response.status, response.headers, response.body.decode("utf-8", "replace"))
        return self._reply(response.body)

    def _reply(self, body: bytes) -> Reply:
        try:
            data = json.loads(body)
        except ValueError:
            raise MalformedReplyError(f"answer is not JSON: {body[:120]!r}") from None
        if not isinstance(data, dict):
            raise MalformedReplyError(f"answer is not a chat completion object: {body[:120]!r}")
        usage = data.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        try:
            text = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            text = None
        cost = self.pricing.cost(prompt_tokens, completion_tokens)
        return Reply(text if isinstance(text, str) else None, prompt_tokens, completion_tokens, cost)

    async def aclose(self) -> None:
        if self._pool.loop is asyncio.get_running_loop():
            self._pool.close()


TRANSPORTS = {"litellm": LiteLLMTransport, "openai_http": OpenAIHTTPTransport}
