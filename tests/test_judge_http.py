"""The `openai_http` transport's HTTP/1.1 client (ppm_trl/judge/http.py) and the batched cache writer.

Unit tests feed the response parser bytes directly; the rest talk to small raw-socket servers defined here, which
send exactly the bytes a test needs (chunked bodies, `Connection: close`, a close in the middle of an answer ...).
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
import zlib

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer, scripted_judge  # noqa: E402

from ppm_trl.judge import LiteLLMJudge  # noqa: E402
from ppm_trl.judge.cache import CacheWriter, ResponseCache  # noqa: E402
from ppm_trl.judge.http import ConnectionPool, ProtocolError, _ResponseParser, header_lines  # noqa: E402
from ppm_trl.judge.transport import HTTPStatusError, OpenAIHTTPTransport  # noqa: E402

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']
FAST = dict(timeout=5.0, backoff_base=0.005, backoff_max=0.02, transport="openai_http")


@pytest.fixture(autouse=True)
def dummy_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")


# ------------------------------------------------------------------------------------------------ parser
def parse(*pieces: bytes, eof: bool = False) -> _ResponseParser:
    parser = _ResponseParser()
    for piece in pieces:
        parser.feed(piece)
    if eof:
        parser.feed_eof()
    return parser


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def test_content_length_body_in_any_split():
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
    for pieces in ([raw], bytewise(raw), [raw[:20], raw[20:60], raw[60:]]):
        parser = parse(*pieces)
        assert parser.complete and parser.status == 200 and parser.body() == b'{"a":1}'
        assert parser.keep_alive and not parser.leftover
        assert parser.headers["Content-Type"] == "application/json" and parser.fields["content-length"] == "7"


def test_chunked_body_with_extensions_and_trailers():
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"4;name=value\r\n{\"a\"\r\n3\r\n:12\r\nA\r\n3456789012\r\n1\r\n}\r\n0\r\nX-Trailer: yes\r\n\r\n")
    for pieces in ([raw], bytewise(raw)):
        parser = parse(*pieces)
        assert parser.complete and parser.body() == b'{"a":123456789012}' and parser.keep_alive
    assert not parse(raw[:-2]).complete  # the empty line after the trailers ends the answer


def test_body_until_close_interim_answers_and_empty_bodies():
    until_close = parse(b"HTTP/1.1 200 OK\r\n\r\npart one, ", b"part two", eof=True)
    assert until_close.complete and until_close.body() == b"part one, part two" and not until_close.keep_alive
    interim = parse(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert interim.complete and interim.status == 200 and interim.body() == b"ok" and "Link" not in interim.headers
    empty = parse(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert empty.complete and empty.body() == b""
    truncated = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", eof=True)
    assert not truncated.complete


@pytest.mark.parametrize(("head", "keep_alive"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nConnection: Upgrade, Close\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", False),  # RFC 9112 6.3
])
def test_keep_alive_decision(head, keep_alive):
    parser = parse(head)
    assert parser.complete and parser.keep_alive is keep_alive


def test_leftover_bytes_mark_the_connection_out_of_step():
    parser = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    assert parser.complete and parser.body() == b"ok" and parser.leftover


@pytest.mark.parametrize("raw", [
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nbad header line\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 70_000,
])
def test_malformed_responses_raise_protocol_error(raw):
    with pytest.raises(ProtocolError):
        parse(raw)


def test_header_lines_refuse_framing_and_injection():
    assert header_lines({"X-Id": "7", "Authorization": "Bearer k"}) == b"X-Id: 7\r\nAuthorization: Bearer k\r\n"
    for bad in ({"X-A": "1\r\nX-Injected: 2"}, {"Bad Name": "1"}, {"Content-Length": "3"}, {"Connection": "close"},
                {"X-A": "caf\u20ac"}):
        with pytest.raises(ValueError):
            header_lines(bad)
    with pytest.raises(ValueError, match="header"):  # refused when the judge is built, not at its first request
        LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", transport="openai_http",
                     extra_headers={"X-Trace": "a\r\nHost: evil"})
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


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_keep_alive_connections_are_reused():
    async def scenario():
        async with RawServer(lambda n, body: ok(b'{"n": %d}' % n)) as server:
            pool = ConnectionPool(server.url(), {"X-Extra": "1"})
            answers = [await pool.post(b'{"q": %d}' % i, 5.0, {"Authorization": "Bearer k"}) for i in range(5)]
            concurrent = await asyncio.gather(*(pool.post(b"{}", 5.0) for _ in range(4)))
            pool.close()
            return server, answers, concurrent

    server, answers, concurrent = run(scenario())
    assert [json.loads(a.body)["n"] for a in answers] == [1, 2, 3, 4, 5]
    assert all(a.status == 200 for a in answers + concurrent)
    assert server.connections == 4  # 1 for the sequential requests, reused; 3 more for the concurrent burst
    line, headers, body = server.requests[0]
    assert line == "POST /v1/chat/completions HTTP/1.1" and body == b'{"q": 0}'
    assert headers["host"] == f"127.0.0.1:{server.port}" and headers["content-type"] == "application/json"
    assert headers["authorization"] == "Bearer k" and headers["x-extra"] == "1"


def test_connection_close_and_http10_are_not_reused():
    async def scenario(answer, close_after):
        async with RawServer(answer, close_after=close_after) as server:
            pool = ConnectionPool(server.url(), {})
            for _ in range(3):
                assert (await pool.post(b"{}", 5.0)).body == b'{"ok": true}'
            return server.connections

    assert run(scenario(lambda n, body: ok(extra=b"Connection: close\r\n"), True)) == 3
    assert run(scenario(lambda n, body: b"HTTP/1.0 200 OK\r\n\r\n" + b'{"ok": true}', True)) == 3  # body ends at close
    assert run(scenario(lambda n, body: ok(extra=b"Connection: close\r\n"), False)) == 3  # even if the server lingers


def test_chunked_and_gzip_answers():
    payload = json.dumps({"choices": [{"message": {"content": "x" * 5000}}]}).encode()

    def chunked(n, body):
        data = gzip.compress(payload) if n == 2 else payload
        pieces = [data[i : i + 1000] for i in range(0, len(data), 1000)]
        encoding = b"Content-Encoding: gzip\r\n" if n == 2 else b""
        return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + encoding + b"\r\n"
                + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")

    async def scenario():
        async with RawServer(chunked) as server:
            pool = ConnectionPool(server.url(), {})
            answers = [await pool.post(b"{}", 5.0) for _ in range(3)]
            return server.connections, answers

    connections, answers = run(scenario())
    assert [a.body for a in answers] == [payload] * 3 and connections == 1


def test_deflate_bodies_zlib_wrapped_or_raw():
    from ppm_trl.judge.http import _decode

    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert _decode(zlib.compress(b"abc"), "deflate") == _decode(raw.compress(b"abc") + raw.flush(), "Deflate") == b"abc"
    assert _decode(b"abc", None) == _decode(b"abc", "identity") == b"abc"
    for body, coding in ((b"not gzip", "gzip"), (b"abc", "br")):
        with pytest.raises(ProtocolError):
            _decode(body, coding)


def test_server_closing_idle_connection_is_noticed():
    async def scenario():
        async with RawServer(lambda n, body: ok()) as server:
            pool = ConnectionPool(server.url(), {})
            await pool.post(b"{}", 5.0)
            for writer in server.writers:  # the server's keep-alive timeout fires
                writer.close()
            await asyncio.sleep(0.05)
            answer = await pool.post(b"{}", 5.0)
            return server.connections, answer

    connections, answer = run(scenario())
    assert answer.status == 200 and connections == 2


def test_close_mid_answer_timeout_and_refused_connection_raise_retryable_errors():
    async def scenario():
        cut_short = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial"
        async with RawServer(lambda n, body: cut_short, close_after=True) as server:
            pool = ConnectionPool(server.url(), {})
            with pytest.raises(ConnectionResetError):
                await pool.post(b"{}", 5.0)
        async with RawServer(lambda n, body: None) as server:  # closes without a byte
            with pytest.raises(ConnectionError):
                await ConnectionPool(server.url(), {}).post(b"{}", 5.0)
        async with RawServer(lambda n, body: b"HTTP/1.1 200 OK\r\n") as server:  # never finishes the head
            pool = ConnectionPool(server.url(), {})
            with pytest.raises(asyncio.TimeoutError):
                await pool.post(b"{}", 0.2)
            assert pool._idle == []  # a timed-out connection is never reused
        port = server.port  # closed now: nothing listens there
        with pytest.raises(ConnectionError, match="cannot connect"):
            await ConnectionPool(f"http://127.0.0.1:{port}/v1/chat/completions", {}).post(b"{}", 5.0)

    run(scenario())


def test_error_status_carries_headers_for_retry_after():
    answer = b'HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 9\r\n\r\n{"e": 42}'

    async def scenario():
        async with RawServer(lambda n, body: answer) as server:
            transport = OpenAIHTTPTransport("openai/x", server.url().rsplit("/chat/completions", 1)[0], 5.0, None, {})
            with pytest.raises(HTTPStatusError) as raised:
                await transport.send([{"role": "user", "content": "hi"}], 0.0)
            await transport.aclose()
            return raised.value

    error = run(scenario())
    assert error.status_code == 429 and error.headers["Retry-After"] == "7" and "sk-loopback" not in str(error)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_with_a_trusted_certificate(tmp_path, monkeypatch):
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(certificate), "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate, key)

    async def scenario(trusted: bool):
        async with RawServer(lambda n, body: ok(), ssl_context=context) as server:
            pool = ConnectionPool(server.url("https", "localhost"), {})
            if not trusted:
                with pytest.raises(ConnectionError, match="cannot connect"):  # unverified certificate: refused
                    await pool.post(b"{}", 5.0)
                return None
            answers = [await pool.post(b"{}", 5.0) for _ in range(2)]
            pool.close()
            return server.connections, answers

    run(scenario(trusted=False))
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # how a user trusts a private CA, too
    connections, answers = run(scenario(trusted=True))
    assert connections == 1 and [a.body for a in answers] == [b'{"ok": true}'] * 2


# ---------------------------------------------------------------------------------- through the judge
def test_judge_retries_a_dropped_answer_and_reconnects():
    def answer(n, body):
        if n == 1:  # cut short: the connection closes in the middle of the body
            return b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"id\"", "close"
        content = scripted_judge(json.loads(body))
        return ok(json.dumps({"choices": [{"message": {"content": content}}]}).encode())

    async def scenario():
        async with RawServer(answer, close_after=False) as server:
            api_base = server.url().rsplit("/chat/completions", 1)[0]
            judge = LiteLLMJudge("openai/scripted-judge", api_base=api_base, **FAST)
            grades = await asyncio.to_thread(judge.grade_prefixes, [("P", POINTS, "alpha")])
            await asyncio.to_thread(judge.close)
            return grades, judge.stats.snapshot(), len(server.requests)

    grades, stats, requests = run(scenario())
    assert grades == [[True, False, False]] and (stats["retries"], stats["failures"], requests) == (1, 0, 2)


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


def test_cache_writer_batches_and_serves_unwritten_entries(tmp_path):
    cache = ResponseCache(tmp_path)
    jobs = []
    original = cache.put_many

    def counted(entries):
        jobs.append(len(entries))
        return original(entries)

    cache.put_many = counted

    async def scenario():
        writer = CacheWriter(cache, delay=60.0, max_pending=1000)
        futures = [writer.put(f"{i:064x}", {"content": f"answer {i}"}) for i in range(50)]
        assert writer.get(f"{7:064x}") == {"content": "answer 7"} and cache.get(f"{7:064x}") is None
        writer.flush()
        assert await asyncio.gather(*futures) == [None] * 50
        late = writer.put("f" * 64, {"content": "late"})
        writer.flush()
        await late
        small = CacheWriter(cache, delay=60.0, max_pending=10)  # the size bound flushes without being asked
        more = [small.put(f"a{i:063x}", {"content": "x"}) for i in range(10)]
        await asyncio.gather(*more)
        quick = CacheWriter(cache, delay=0.01)  # and so does the delay
        await quick.put("d" * 64, {"content": "y"})

    run(scenario())
    assert jobs == [50, 1, 10, 1] and len(cache) == 62 and cache.get(f"{7:064x}") == {"content": "answer 7"}
