"""Unbounded answers (#23 item 2): a decoded-size cap on judge answers, on both transports.

A loopback server answers requests that mention "bomb" with a gzip body that inflates to 64 MiB (~64 KB on the
wire), "large" with a plain body over the cap, and everything else with a small answer. The cap must fail the
bomb's attempt with a reason that names it, read (and inflate) no more than about the cap, and leave the other
requests of the same batch on the same judge answered. Counts and memory, never wall-clock time.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import tracemalloc
import zlib

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402

from ppm_trl.judge import LiteLLMJudge  # noqa: E402
from ppm_trl.judge.arguments import JudgeArguments
from ppm_trl.judge.tasks import REQUEST_ERROR  # noqa: E402

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

MIB = 2**20
CAP = 1 * MIB
BOMB_INFLATED = 64 * MIB


def _completion(content: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


def _gzip_bomb() -> bytes:
    """A chat completion whose content is 64 MiB of 'a', gzip-compressed (~64 KB), built without holding 64 MiB."""
    head, tail = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "', b'"}}]}'
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(head)]
    block = b"a" * MIB
    parts += [packer.compress(block) for _ in range(BOMB_INFLATED // MIB)]
    parts += [packer.compress(tail), packer.flush()]
    return b"".join(parts)


class CappingServer:
    """A tiny HTTP/1.1 chat-completions server (stdlib asyncio) in a thread; counts what it serves."""

    def __init__(self):
        self.bomb = _gzip_bomb()
        self.served: dict[str, int] = {"bomb": 0, "large": 0, "normal": 0}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(120)
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self):
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await asyncio.wait_for(self._stop.wait(), 300)
        except TimeoutError:
            pass
        server.close()

    async def _handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = json.loads(await reader.readexactly(length))
                user = body["messages"][-1]["content"]
                extra = b""
                if "bomb" in user:
                    kind, payload, extra = "bomb", self.bomb, b"Content-Encoding: gzip\r\n"
                elif "large" in user:
                    kind, payload = "large", _completion("b" * (2 * CAP))
                else:
                    kind, payload = "normal", _completion(f"answer to {user}")
                with self._lock:
                    self.served[kind] += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra
                             + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, StopIteration):
            pass
        finally:
            writer.close()


@pytest.fixture(scope="module")
def server():
    os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with CappingServer() as running:
        yield running


def _judge(server, transport="openai_http", **overrides):
    settings = dict(api_base=server.api_base, timeout=60, transport=transport, num_retries=1, backoff_base=0.0,
                    max_response_bytes=CAP, max_concurrency=8) | overrides
    return LiteLLMJudge("openai/capped-judge", **settings)


def _ask(judge, users):
    return judge.run(lambda: judge._answer_many([([{"role": "user", "content": u}], lambda t: t) for u in users]))


@pytest.mark.parametrize("transport", ["openai_http", "litellm"])
def test_gzip_bomb_fails_its_attempts_and_other_requests_on_the_judge_complete(server, transport):
    normal = [f"question {i}" for i in range(12)]
    before = dict(server.served)
    with _judge(server, transport=transport) as judge:
        results = _ask(judge, ["bomb"] + normal)
    bomb, answers = results[0], results[1:]
    assert bomb.kind == REQUEST_ERROR and "max_response_bytes=1,048,576" in bomb.reason  # the reason names the cap
    assert bomb.attempts == 2  # each attempt failed; retried like a malformed answer, then given up
    assert answers == [f"answer to {u}" for u in normal]  # every concurrent request on the same judge answered
    assert server.served["bomb"] - before["bomb"] == 2 and server.served["normal"] - before["normal"] == len(normal)


@pytest.mark.parametrize("transport", ["openai_http", "litellm"])
def test_gzip_bomb_is_inflated_no_further_than_the_cap(server, transport):
    with _judge(server, transport=transport, num_retries=0) as judge:
        _ask(judge, ["warm up"])  # imports and the connection pool are not what is measured
        tracemalloc.start()
        try:
            failure = _ask(judge, ["bomb"])[0]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert "max_response_bytes" in failure.reason
    assert peak < 8 * CAP, f"reading a capped answer allocated {peak / MIB:.1f} MiB (a 64 MiB bomb was inflated)"


@pytest.mark.parametrize("transport", ["openai_http", "litellm"])
def test_answer_over_the_cap_fails_and_one_under_it_is_read(server, transport):
    with _judge(server, transport=transport) as judge:
        large, small = _ask(judge, ["large", "small"])
    assert large.kind == REQUEST_ERROR and "max_response_bytes=1,048,576" in large.reason
    assert small == "answer to small"
    with _judge(server, transport=transport, max_response_bytes=4 * CAP) as judge:
        assert _ask(judge, ["large"])[0] == "b" * (2 * CAP)  # a larger cap reads it: the setting is what refused it


def test_unreadable_answer_is_redacted_in_bounded_pieces(monkeypatch):
    lengths = []
    from ppm_trl.judge import sending

    real_redact = sending.redact
    monkeypatch.setattr(sending, "redact", lambda text: (lengths.append(len(text)), real_redact(text))[1])
    monkeypatch.setenv("MY_JUDGE_TOKEN", "sk-secret-0123456789")
    huge = "sk-secret-0123456789 " + "x" * (8 * MIB) + " sk-secret-0123456789"
    shown = sending._excerpt(huge)
    assert "sk-secret" not in shown and shown.startswith("*** x") and shown.endswith("x ***")
    assert max(lengths) < 4096  # never the whole 8 MiB on the event loop


@pytest.mark.parametrize("bad", [0, 100, -1, True, 2.5, "4MB", None])
def test_max_response_bytes_is_checked(bad):
    with pytest.raises(ValueError, match="max_response_bytes"):
        LiteLLMJudge("openai/x", api_base="http://127.0.0.1:9/v1", max_response_bytes=bad)


def test_max_response_bytes_is_a_judge_setting():
    arguments = JudgeArguments(judge_max_response_bytes=2 * MIB)
    kwargs = arguments.judge_kwargs("/tmp/out")
    assert kwargs["max_response_bytes"] == 2 * MIB and JudgeArguments().judge_kwargs("/tmp")["max_response_bytes"] == 4 * MIB
    judge = LiteLLMJudge(**kwargs | {"cache_dir": None})
    assert judge.config()["max_response_bytes"] == 2 * MIB

    import argparse

    from ppm_trl.prepare import add_prepare_arguments

    parsed = add_prepare_arguments(argparse.ArgumentParser()).parse_args(
        ["--dataset", "d", "--reference-column", "r", "--judge-model", "m", "--out", "o", "--max-response-bytes", "2048"])
    assert parsed.judge_max_response_bytes == 2048  # the field's flag, in prepare's older spelling
