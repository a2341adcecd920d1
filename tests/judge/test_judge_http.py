"""The `openai_http` transport (aiohttp) against small raw-socket servers, and the batched cache writer.

The raw servers defined here send exactly the bytes a test needs (chunked and gzip bodies, `Connection: close`, a
close in the middle of an answer, a redirect ...), so each test pins one behaviour of the transport as the judge
relies on it: connections are reused, failures are retryable errors, redirects are not followed, nothing a caller
passes can smuggle a header in, and the key never appears in an error.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import shutil
import ssl
import subprocess

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer, scripted_judge  # noqa: E402

from ppm_trl.judge import LiteLLMJudge  # noqa: E402
from ppm_trl.judge.cache import CacheWriter, ResponseCache, request_fingerprint, request_key  # noqa: E402
from ppm_trl.judge.errors import (
    HTTPStatusError,
    classify,  # noqa: E402
)
from ppm_trl.judge.transport import OpenAIHTTPTransport

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']
FAST = dict(timeout=5.0, backoff_base=0.005, backoff_max=0.02, transport="openai_http")
KEY = "sk-loopback-dummy-key"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def dummy_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def test_bad_headers_and_urls_are_refused_when_the_judge_is_built():
    for bad in ({"X-A": "1\r\nX-Injected: 2"}, {"X-A": "1\nHost: evil"}, {"X-A": "a\0b"}, {"Bad Name": "1"},
                {"Content-Length": "3"}, {"Connection": "close"}, {"Transfer-Encoding": "chunked"}, {"Host": "evil"},
                {"X-A": "caf\u20ac"}):
        with pytest.raises(ValueError, match="extra_headers"):
            LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", transport="openai_http", extra_headers=bad)
    secret_header = {"X-A": "1\r\nsk-header-SECRET-123"}
    with pytest.raises(ValueError) as raised:
        LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", transport="openai_http", extra_headers=secret_header)
    assert "SECRET" not in str(raised.value)  # a value may be a key: never quoted
    with pytest.raises(ValueError, match="credentials"):
        OpenAIHTTPTransport("openai/x", "http://user:pw@127.0.0.1:1/v1", 5.0, None, {})
    with pytest.raises(ValueError, match="http"):
        OpenAIHTTPTransport("openai/x", "ftp://127.0.0.1/v1", 5.0, None, {})


# ---------------------------------------------------------------------------------- raw test server
class RawServer:
    """Loopback server whose `answer(request_number, body)` returns the raw bytes to send; counts connections.

    `answer` may return None to close the connection without answering, or `(data, "close")` to close it after
    sending `data`. Otherwise the connection stays open unless `close_after` is true.
    """

    def __init__(self, answer, close_after: bool = False, ssl_context: ssl.SSLContext | None = None):
        self.answer, self.close_after, self.ssl_context = answer, close_after, ssl_context
        self.connections = 0
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}/v1/chat/completions"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
                body = await reader.readexactly(int(headers["content-length"]))
                self.requests.append((head[0], headers, body))
                data = self.answer(len(self.requests), body)
                if data is None:
                    break
                close = self.close_after
                if isinstance(data, tuple):
                    data, close = data[0], True
                writer.write(data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def ok(body: bytes = b'{"ok": true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def completion(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"content": content}}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def api_base(server: RawServer, scheme: str = "http", host: str = "127.0.0.1") -> str:
    return server.url(scheme, host).rsplit("/chat/completions", 1)[0]


def test_keep_alive_connections_are_reused():
    async def scenario():
        async with RawServer(lambda n, body: ok(completion(f"answer {n}"))) as server:
            transport = OpenAIHTTPTransport("openai/x", api_base(server), 5.0, None, {"extra_headers": {"X-Extra": "1"}})
            answers = [await transport.send(MESSAGES, 0.0) for _ in range(5)]
            concurrent = await asyncio.gather(*(transport.send(MESSAGES, 0.0) for _ in range(4)))
            await transport.aclose()
            return server, answers, concurrent

    server, answers, concurrent = run(scenario())
    assert [a.text for a in answers] == [f"answer {n}" for n in range(1, 6)]
    assert all(a.text.startswith("answer") for a in concurrent) and answers[0].prompt_tokens == 3
    assert server.connections == 4  # 1 for the sequential requests, reused; 3 more for the concurrent burst
    line, headers, body = server.requests[0]
    assert line == "POST /v1/chat/completions HTTP/1.1"
    assert json.loads(body) == {"model": "x", "messages": MESSAGES, "temperature": 0.0}
    assert headers["host"] == f"127.0.0.1:{server.port}" and headers["content-type"] == "application/json"
    assert headers["authorization"] == f"Bearer {KEY}" and headers["x-extra"] == "1"


def test_connections_are_bounded_by_max_concurrency():
    async def scenario():
        async with RawServer(lambda n, body: ok(completion("x"))) as server:
            transport = OpenAIHTTPTransport("openai/x", api_base(server), 5.0, None, {}, max_concurrency=2)
            await asyncio.gather(*(transport.send(MESSAGES, 0.0) for _ in range(8)))
            await transport.aclose()
            return server.connections

    assert run(scenario()) == 2


def test_connection_close_and_http10_are_not_reused():
    async def scenario(answer, close_after):
        async with RawServer(answer, close_after=close_after) as server:
            transport = OpenAIHTTPTransport("openai/x", api_base(server), 5.0, None, {})
            for _ in range(3):
                assert (await transport.send(MESSAGES, 0.0)).text == "x"
            await transport.aclose()
            return server.connections

    assert run(scenario(lambda n, body: ok(completion("x"), b"Connection: close\r\n"), True)) == 3
    assert run(scenario(lambda n, body: b"HTTP/1.0 200 OK\r\n\r\n" + completion("x"), True)) == 3  # ends at close
    assert run(scenario(lambda n, body: ok(completion("x"), b"Connection: close\r\n"), False)) == 3  # server lingers


def test_chunked_and_gzip_answers():
    payload = completion("x" * 5000)

    def chunked(n, body):
        data = gzip.compress(payload) if n == 2 else payload
        pieces = [data[i : i + 1000] for i in range(0, len(data), 1000)]
        encoding = b"Content-Encoding: gzip\r\n" if n == 2 else b""
        return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + encoding + b"\r\n"
                + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")

    async def scenario():
        async with RawServer(chunked) as server:
            transport = OpenAIHTTPTransport("openai/x", api_base(server), 5.0, None, {})
            answers = [await transport.send(MESSAGES, 0.0) for _ in range(3)]
            await transport.aclose()
            return server.connections, answers

    connections, answers = run(scenario())
    assert [a.text for a in answers] == ["x" * 5000] * 3 and connections == 1


def test_failures_raise_retryable_errors():
    async def failure(answer, timeout=5.0, close_after=True):
        async with RawServer(answer, close_after=close_after) as server:
            transport = OpenAIHTTPTransport("openai/x", api_base(server), timeout, None, {})
            try:
                await transport.send(MESSAGES, 0.0)
            except Exception as error:  # noqa: BLE001 - the test looks at it
                return error
            finally:
                await transport.aclose()
        raise AssertionError("no error raised")

    async def scenario():
        errors = [
            await failure(lambda n, body: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial"),  # cut short
            await failure(lambda n, body: None),  # closes without a byte
            await failure(lambda n, body: b"HTTP/1.1 200 OK\r\n", timeout=0.2, close_after=False),  # never finishes
            await failure(lambda n, body: b"SSH-2.0-OpenSSH\r\n\r\n"),  # not HTTP
            await failure(lambda n, body: ok(b"not json")),
        ]
        async with RawServer(lambda n, body: None) as server:
            port = server.port
        transport = OpenAIHTTPTransport("openai/x", f"http://127.0.0.1:{port}/v1", 5.0, None, {})  # nothing listens
        try:
            await transport.send(MESSAGES, 0.0)
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        await transport.aclose()
        return errors

    errors = run(scenario())
    assert len(errors) == 6 and isinstance(errors[2], asyncio.TimeoutError)
    assert [classify(error) for error in errors] == ["retry"] * 6
    assert all(KEY not in f"{error!r} {error}" for error in errors)


def test_error_status_carries_headers_for_retry_after_and_redirects_are_not_followed():
    answers = {
        "/v1": b'HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 9\r\n\r\n{"e": 42}',
        "/moved": b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v1/chat/completions\r\nContent-Length: 0\r\n\r\n",
    }

    async def scenario():
        errors = {}
        for path, answer in answers.items():
            async with RawServer(lambda n, body, answer=answer: answer) as server:
                transport = OpenAIHTTPTransport("openai/x", f"http://127.0.0.1:{server.port}{path}", 5.0, None, {})
                with pytest.raises(HTTPStatusError) as raised:
                    await transport.send(MESSAGES, 0.0)
                await transport.aclose()
                errors[path] = (raised.value, len(server.requests))
        return errors

    errors = run(scenario())
    rate_limited, requests = errors["/v1"]
    assert rate_limited.status_code == 429 and rate_limited.headers["Retry-After"] == "7" and requests == 1
    assert KEY not in str(rate_limited)
    redirected, requests = errors["/moved"]
    assert redirected.status_code == 307 and requests == 1 and classify(redirected) == "fail"  # not followed


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_with_a_trusted_certificate(tmp_path, monkeypatch):
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(certificate), "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate, key)

    async def scenario(trusted: bool):
        async with RawServer(lambda n, body: ok(completion("tls")), ssl_context=context) as server:
            transport = OpenAIHTTPTransport("openai/x", api_base(server, "https", "localhost"), 5.0, None, {})
            try:
                if not trusted:
                    with pytest.raises(Exception) as raised:  # unverified certificate: refused, retryable
                        await transport.send(MESSAGES, 0.0)
                    assert "certificate" in str(raised.value).lower() and classify(raised.value) == "retry"
                    return None
                answers = [await transport.send(MESSAGES, 0.0) for _ in range(2)]
                return server.connections, answers
            finally:
                await transport.aclose()

    run(scenario(trusted=False))
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # how a user trusts a private CA, too
    connections, answers = run(scenario(trusted=True))
    assert connections == 1 and [a.text for a in answers] == ["tls"] * 2


# ---------------------------------------------------------------------------------- through the judge
def test_judge_retries_a_dropped_answer_and_reconnects():
    def answer(n, body):
        if n == 1:  # cut short: the connection closes in the middle of the body
            return b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"id\"", "close"
        return ok(completion(scripted_judge(json.loads(body))))

    async def scenario():
        async with RawServer(answer, close_after=False) as server:
            judge = LiteLLMJudge("openai/scripted-judge", api_base=api_base(server), **FAST)
            grades = await asyncio.to_thread(judge.grade_prefixes, [("P", POINTS, "alpha")])
            await asyncio.to_thread(judge.close)
            return grades, judge.stats.snapshot(), len(server.requests), server.connections

    grades, stats, requests, connections = run(scenario())
    assert grades == [[True, False, False]] and (stats["retries"], stats["failures"], requests) == (1, 0, 2)
    assert connections == 2


def test_judge_notices_a_server_closing_an_idle_connection():
    async def scenario():
        async with RawServer(lambda n, body: ok(completion(scripted_judge(json.loads(body))))) as server:
            judge = LiteLLMJudge("openai/scripted-judge", api_base=api_base(server), **FAST)
            first = await asyncio.to_thread(judge.grade_prefixes, [("P", POINTS, "alpha")])
            for writer in server.writers:  # the server's keep-alive timeout fires
                writer.close()
            await asyncio.sleep(0.05)
            second = await asyncio.to_thread(judge.grade_prefixes, [("P", POINTS, "beta")])
            await asyncio.to_thread(judge.close)
            return first + second, judge.stats.snapshot(), server.connections

    grades, stats, connections = run(scenario())
    assert grades == [[True, False, False], [False, True, False]] and stats["failures"] == 0 and connections == 2


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_cache_write_failure_keeps_the_answer(tmp_path, caplog, transport):
    with JudgeServer() as server:
        judge = LiteLLMJudge("openai/scripted-judge", api_base=server.api_base, cache_dir=tmp_path / "cache",
                             **{**FAST, "transport": transport})

        def broken(key, entry):
            raise OSError("disk full")

        judge._cache.put = broken
        with caplog.at_level(logging.WARNING):
            assert judge.grade_prefixes([("P", POINTS, "alpha"), ("P", POINTS, "beta")]) == [
                [True, False, False], [False, True, False]]
        judge.close()
    assert caplog.text.count("judge cache write") == 2 and "disk full" in caplog.text
    assert len(ResponseCache(tmp_path / "cache")) == 0


def cache_entry(n: int) -> tuple[str, dict]:
    fingerprint = request_fingerprint("openai/x", None, "litellm", [{"role": "user", "content": str(n)}], {})
    return request_key(fingerprint), {"request": fingerprint, "content": f"answer {n}"}


def test_cache_writer_batches_and_serves_unwritten_entries(tmp_path):
    cache = ResponseCache(tmp_path)
    jobs = []
    original = cache.put_many

    def counted(entries):
        jobs.append(len(entries))
        return original(entries)

    cache.put_many = counted
    entries = [cache_entry(n) for n in range(62)]

    async def scenario():
        writer = CacheWriter(cache, delay=60.0, max_pending=1000)
        futures = [writer.put(key, entry) for key, entry in entries[:50]]
        assert writer.get(entries[7][0]) == entries[7][1] and cache.get(entries[7][0]) is None
        writer.flush()
        assert await asyncio.gather(*futures) == [None] * 50
        late = writer.put(*entries[50])
        writer.flush()
        await late
        small = CacheWriter(cache, delay=60.0, max_pending=10)  # the size bound flushes without being asked
        await asyncio.gather(*(small.put(key, entry) for key, entry in entries[51:61]))
        quick = CacheWriter(cache, delay=0.01)  # and so does the delay
        await quick.put(*entries[61])

    run(scenario())
    assert jobs == [50, 1, 10, 1] and len(cache) == 62
    assert [cache.get(key) for key, _ in entries] == [entry for _, entry in entries] and cache.rejected == 0
