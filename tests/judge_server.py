"""A loopback OpenAI-compatible chat-completions server for the judge tests and benchmark.

Stdlib only (asyncio). It binds 127.0.0.1 on an ephemeral port, answers `POST /v1/chat/completions` with a
scripted judge, and injects faults on request: 429 with `Retry-After`, 500, timeouts (it answers after the
client has given up) and garbage text (a well-formed response whose content no parser accepts). It is bounded
(`max_requests`) and self-stopping (`max_lifetime` seconds), so a test that forgets to stop it cannot hang.

`scripted_judge` plays a judge that follows the prompt's *structure* the way a careless LLM would: it takes the
first `</rollout>` (or the first `## Evaluation` header) as the end of the untrusted text and obeys an
"ignore the rubric" found in what it then believes is instruction text. The adversarial tests rely on that
naivety: only the client's escaping stands between an injection and a raised grade.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import threading
import time
from collections.abc import Callable

FAULT_KINDS = ("rate_limit", "server_error", "timeout", "garbage")  # transient: the client retries them
ALL_FAULT_KINDS = FAULT_KINDS + ("unauthorized", "bad_request")  # 401 (fatal) and 400 (this item only)
ALL_FAULT_KINDS += ("context_length", "model_not_found")  # vLLM's 400 "maximum context length" and 404 bodies
ALL_FAULT_KINDS += ("key_not_valid",)  # Gemini's answer to a wrong key: HTTP 400, not 401
GARBAGE_TEXT = "%%% lorem ipsum dolor sit amet %%%"

_QUOTED = re.compile(r'"([^"]+)"')
_NUMBERED = re.compile(r"^\s*(\d+)\s*[.)]\s*(.+?)\s*$", re.MULTILINE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def _between(text: str, start: str, end: str) -> tuple[str, str]:
    """Text after the first `start` up to the first `end`, and the text after that `end` (regex markers)."""
    head = re.search(start, text, re.MULTILINE)
    if head is None:
        return "", ""
    tail = re.search(end, text[head.end() :], re.MULTILINE)
    if tail is None:
        return text[head.end() :], ""
    return text[head.end() : head.end() + tail.start()], text[head.end() + tail.end() :]


def _criterion_met(criterion: str, evidence_text: str) -> bool:
    # A criterion names its evidence in double quotes; without quotes the whole criterion must appear.
    quoted = _QUOTED.findall(criterion)
    needles = quoted if quoted else [criterion]
    return all(needle.lower() in evidence_text.lower() for needle in needles)


def _grade_ppm(user: str) -> str:
    rollout, after_rollout = _between(user, r"<rollout>", r"</rollout>")
    rubric, _ = _between(user, r"^#\s*Rubric\s*$", r"^#\s*Instructions\s*$")
    criteria = [text for _, text in _NUMBERED.findall(rubric)]
    # The careless part: text after the first </rollout> is read as instructions.
    obey_injection = "ignore the rubric" in after_rollout.lower()
    verdicts = [obey_injection or _criterion_met(c, rollout) for c in criteria]
    lines = ["Section 1 – Reasoning:"]
    for i, (criterion, yes) in enumerate(zip(criteria, verdicts), start=1):
        evidence = rollout.strip() if yes else "not present in rollout"  # quotes the rollout verbatim
        lines += [f"{i}. Criterion: {criterion}.", f"Evidence: {evidence}", "Reason: scripted.", f"Verdict: {'YES' if yes else 'NO'}."]
    lines.append("Section 2 – Grades (one line per criterion):")
    lines += [f"{i}. {'YES' if yes else 'NO'}" for i, yes in enumerate(verdicts, start=1)]
    return "\n".join(lines)


def _grade_standard(user: str) -> str:
    student, _ = _between(user, r"^Student solution:\s*$", r"^-------\s*$")
    rubric, _ = _between(user, r"^Rubric:\s*$", r"^-------\s*$")
    criteria = [text for _, text in _NUMBERED.findall(rubric)]
    return "\n".join(f"{i}. {'YES' if _criterion_met(c, student) else 'NO'}" for i, c in enumerate(criteria, start=1))


def _grade_papo(user: str) -> str:
    reference, _ = _between(user, r"^## Reference Solution\s*$", r"^## Student Solution\s*$")
    student, after_student = _between(user, r"^## Student Solution\s*$", r"^## Evaluation\s*$")
    reference_lines = [line.strip() for line in reference.splitlines() if line.strip()]
    answers = _BOXED.findall(reference)
    if "ignore the rubric" in after_student.lower():
        score = "1"
    elif reference_lines and all(line in student for line in reference_lines):
        score = "1"
    elif answers and f"\\boxed{{{answers[-1]}}}" in student:
        score = "0.5"
    else:
        score = "0"
    last_line = student.strip().splitlines()[-1] if student.strip() else ""
    return f"Analysis: the student ends with: {last_line}\nScore: $\\boxed{{{score}}}$"


def _generate_rubric(user: str) -> str:
    solution, _ = _between(user, r"^##\s*Reference solution\s*$", r"^##\s*Instructions\s*$")
    lines = [line.strip() for line in solution.splitlines() if line.strip()]
    items = [f'The solution states "{line}".' for line in lines[:-1]]
    answers = _BOXED.findall(solution)
    items.append(f"The solution concludes that the answer is \\boxed{{{answers[-1] if answers else lines[-1]}}}.")
    body = "\n".join(f"{i}. {item}" for i, item in enumerate(items, start=1))
    return f"Breakdown: one item per line.\nOne item per step.\n<rubric>\n{body}\n</rubric>"


def _generate_graph(user: str) -> str:
    rubric, _ = _between(user, r"^##\s*Rubric\s*$", r"^##\s*Instructions\s*$")
    n = len(_NUMBERED.findall(rubric))
    rules = [f'<rule if_all="{k}" makes_obsolete="{k - 1}"/>' for k in range(2, n)]
    return "Policy: each step obsoletes the one before.\n<makes_obsolete_graph>\n" + "\n".join(rules) + "\n</makes_obsolete_graph>"


def _review_process(user: str) -> str:
    solution, _ = _between(user, r"^#\s*Solution\s*$", r"^#\s*Task\s*$")
    parts = re.findall(r"<part_(\d+)>(.*?)</part_\1>", solution, re.DOTALL)
    analyses = []
    for number, body in parts:
        analyses.append(f"<analysis_{number}>\nChecked.\n</analysis_{number}>")
        if "error" in body.lower():
            return "\n".join(analyses) + "\n<conclusion>\nIncorrect\n</conclusion>"
    return "\n".join(analyses) + "\n<conclusion>\nCorrect\n</conclusion>"


def scripted_judge(body: dict) -> str:
    """Answer a chat-completions request body the way the paper's prompts ask, naively (see module doc)."""
    messages = body.get("messages", [])
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    if "## Scoring Rubric" in user:
        return _grade_papo(user)
    if "Section 2" in system:
        return _grade_ppm(user)
    if "grade the student solution against the rubric" in system:
        return _grade_standard(user)
    if "Generate a rubric" in system:
        return _generate_rubric(user)
    if "obsoletion graph" in system:
        return _generate_graph(user)
    if "<conclusion>" in system:
        return _review_process(user)
    return GARBAGE_TEXT


def count_tokens(text: str) -> int:
    """The server's (deliberately simple) token count: whitespace-separated words."""
    return len(text.split())


class JudgeServer:
    """Threaded asyncio HTTP/1.1 server; use as a context manager. Counters are safe to read from the test."""

    def __init__(
        self,
        responder: Callable[[dict], str] = scripted_judge,
        latency: float = 0.0,
        fault_rate: float = 0.0,
        fault_kinds: tuple[str, ...] = FAULT_KINDS,
        retry_after: str | None = "0.01",
        timeout_delay: float = 2.0,
        seed: int = 0,
        script: tuple[str | None, ...] = (),
        max_requests: int = 20_000,
        max_lifetime: float = 300.0,
        rate_limit_headers: dict[str, str] | None = None,
        echo_authorization: bool = False,
        usage: object = "count",
        served_models: tuple[str, ...] | None = None,
        require_key: str | None = None,
        quota: tuple[int, float] | None = None,
        raw_reply: Callable[[dict], bytes] | None = None,
    ):
        unknown = (set(fault_kinds) | set(script)) - set(ALL_FAULT_KINDS) - {None}
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; accepted: {ALL_FAULT_KINDS}")
        self.responder = responder
        self.latency = latency
        self.fault_rate = fault_rate
        self.fault_kinds = tuple(fault_kinds)
        self.retry_after = retry_after
        self.timeout_delay = timeout_delay
        self.script = list(script)  # faults of the first requests, in arrival order (None = answer normally)
        self.max_requests = max_requests
        self.max_lifetime = max_lifetime
        self.rate_limit_headers = dict(rate_limit_headers or {})  # more 429 headers, e.g. {"retry-after-ms": "5000"}
        self.echo_authorization = echo_authorization  # a careless server: error bodies quote the Authorization header
        self.usage = usage  # "count": real token counts; anything else is sent as the 200 replies' `usage` verbatim
        self.served_models = served_models  # None: any model name; else others get vLLM's 404
        self.require_key = require_key  # None: no key needed; else `Authorization: Bearer <key>` or 401
        # (requests, seconds): a hosted judge's quota over a sliding window; beyond it a 429 with the Retry-After
        # at which the oldest counted request leaves the window. `admitted` holds the counted arrival times.
        self.quota = quota
        self.raw_reply = raw_reply  # request body → the bytes of a 200 answer, sent verbatim (hostile servers)
        self.admitted: collections.deque[float] = collections.deque()
        self.admitted_times: list[float] = []
        self.arrival_times: list[float] = []  # every chat request, admitted or not (what the server sees)
        self.quota_rejections = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests = 0
        self.faults: collections.Counter[str] = collections.Counter()
        self.bodies: list[dict] = []
        self.authorization: list[str] = []
        self.tokens_served = {"prompt": 0, "completion": 0}
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def total_faults(self) -> int:
        with self._lock:
            return sum(self.faults.values())

    def reset_counters(self) -> None:
        with self._lock:
            self.requests = 0
            self.faults.clear()
            self.bodies.clear()
            self.authorization.clear()
            self.tokens_served = {"prompt": 0, "completion": 0}
            self.admitted.clear()
            self.admitted_times.clear()
            self.arrival_times.clear()
            self.quota_rejections = 0

    def max_in_window(self, seconds: float, admitted_only: bool = True) -> int:
        """The most requests (admitted ones: what a quota counts; or all that arrived) in any `seconds` window."""
        with self._lock:
            times = sorted(self.admitted_times if admitted_only else self.arrival_times)
        best, start = 0, 0
        for end, moment in enumerate(times):
            while moment - times[start] >= seconds:
                start += 1
            best = max(best, end - start + 1)
        return best

    def _over_quota(self) -> float | None:
        """Seconds until the quota admits another request (None: admitted now and counted)."""
        if self.quota is None:
            return None
        limit, window = self.quota
        now = time.monotonic()
        with self._lock:
            self.arrival_times.append(now)
            while self.admitted and now - self.admitted[0] >= window:
                self.admitted.popleft()
            if len(self.admitted) >= limit:
                self.quota_rejections += 1
                return self.admitted[0] + window - now
            self.admitted.append(now)
            self.admitted_times.append(now)
        return None

    def __enter__(self) -> JudgeServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="judge-server", daemon=True)
        self._thread.start()
        if not ready.wait(120):
            raise RuntimeError("judge test server did not start within 120 s")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.run(self._serve(ready))

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=self.max_lifetime)
        except TimeoutError:
            pass
        server.close()
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status, extra, payload = await self._respond(request_line, headers, body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                head_out = [f"HTTP/1.1 {status}", "Content-Type: application/json", f"Content-Length: {len(data)}"]
                head_out += [f"{k}: {v}" for k, v in extra.items()]
                writer.write(("\r\n".join(head_out) + "\r\n\r\n").encode() + data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            writer.close()

    def _draw_fault(self) -> str | None:
        with self._lock:
            self.requests += 1
            if self.requests > self.max_requests:
                return "server_error"
            if self.requests <= len(self.script):
                kind = self.script[self.requests - 1]
            elif self._rng.random() < self.fault_rate:
                kind = self._rng.choice(self.fault_kinds)
            else:
                kind = None
            if kind is not None:
                self.faults[kind] += 1
                return kind
            return None

    async def _respond(self, request_line: str, headers: dict, raw: bytes) -> tuple[str, dict, dict]:
        method, path = request_line.split(" ")[:2]
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            return "404 Not Found", {}, {"error": {"message": f"no route {method} {path}", "type": "not_found"}}
        body = json.loads(raw)
        wait = self._over_quota()
        if wait is not None:
            with self._lock:
                self.requests += 1
                self.faults["quota"] += 1
            error = {"error": {"message": "quota exceeded", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}
            return "429 Too Many Requests", {"Retry-After": f"{max(wait, 0.001):.3f}"}, error
        fault = self._draw_fault()
        with self._lock:
            self.bodies.append(body)
            self.authorization.append(headers.get("authorization", ""))
        await asyncio.sleep(self.latency)
        if fault is None and self.require_key is not None and headers.get("authorization") != f"Bearer {self.require_key}":
            fault = "unauthorized"
        if fault is None and self.served_models is not None and body.get("model") not in self.served_models:
            fault = "model_not_found"
        if fault == "context_length":  # what vLLM answers when the prompt is longer than --max-model-len
            message = ("This model's maximum context length is 1024 tokens. However, your request has 1025 input "
                       "tokens. Please reduce the length of the input messages.")
            return "400 Bad Request", {}, {"object": "error", "message": message, "type": "BadRequestError",
                                           "param": None, "code": 400}
        if fault == "model_not_found":
            message = f"The model `{body.get('model')}` does not exist."
            return "404 Not Found", {}, {"object": "error", "message": message, "type": "NotFoundError",
                                         "param": None, "code": 404}
        if fault == "rate_limit":
            error = {"error": {"message": "rate limited", "type": "rate_limit_error", "code": "rate_limit_exceeded"}}
            extra = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            return "429 Too Many Requests", extra | self.rate_limit_headers, error
        echoed = f" (received Authorization: {headers.get('authorization', '')})" if self.echo_authorization else ""
        if fault == "key_not_valid":
            error = {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                               "status": "INVALID_ARGUMENT", "details": [{"reason": "API_KEY_INVALID"}]}}
            return "400 Bad Request", {}, error
        if fault == "unauthorized":
            error = {"error": {"message": "Incorrect API key provided" + echoed, "type": "invalid_request_error", "code": "invalid_api_key"}}
            return "401 Unauthorized", {}, error
        if fault == "bad_request":
            error = {"error": {"message": "context length exceeded" + echoed, "type": "invalid_request_error", "code": "context_length_exceeded"}}
            return "400 Bad Request", {}, error
        if fault == "server_error":
            return "500 Internal Server Error", {}, {"error": {"message": "boom", "type": "server_error"}}
        if fault == "timeout":
            await asyncio.sleep(self.timeout_delay)
        if fault is None and self.raw_reply is not None:
            return "200 OK", {}, self.raw_reply(body)
        content = GARBAGE_TEXT if fault == "garbage" else self.responder(body)
        prompt_tokens = sum(count_tokens(str(m.get("content", ""))) for m in body.get("messages", []))
        completion_tokens = count_tokens(content)
        if fault != "timeout":  # a timed-out answer never reaches the client
            with self._lock:
                self.tokens_served["prompt"] += prompt_tokens
                self.tokens_served["completion"] += completion_tokens
        return "200 OK", {}, {
            "id": f"chatcmpl-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            } if self.usage == "count" else self.usage,
        }
