"""Hardening round 4 (issue 41): whatever a judge server answers is a grade or one unscorable attempt — never an
exception out of `grade_*`, never a NaN in a count. A JSON body nested past the recursion limit, a parser that
raises, `usage: {0, 0}`, a price table that lies, and a fuzz of random answer shapes on the loopback server."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from judge_server import JudgeServer, scripted_judge  # noqa: E402

from ppm_trl.judge import LiteLLMJudge  # noqa: E402
from ppm_trl.judge.errors import MalformedReplyError, classify  # noqa: E402
from ppm_trl.judge.transport import OpenAIHTTPTransport, checked_cost, token_counts  # noqa: E402

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']
GRADED = [("P", POINTS, "alpha"), ("P", POINTS, "gamma beta")]
TRANSPORTS = ["litellm", "openai_http"]
FAST = dict(timeout=5.0, backoff_base=0.001, backoff_max=0.005, max_concurrency=4)
DEEP = b"[" * 200_000 + b"]" * 200_000  # 400 KB, far under the 4 MB cap; json.loads raises RecursionError


@pytest.fixture(autouse=True)
def dummy_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")


def judge_for(server: JudgeServer, **kwargs) -> LiteLLMJudge:
    return LiteLLMJudge("openai/scripted-judge", api_base=server.api_base, **(FAST | kwargs))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_answer_nested_past_the_recursion_limit_is_retried_then_unscorable(transport):
    with JudgeServer(raw_reply=lambda _: DEEP) as server, judge_for(server, transport=transport,
                                                                     num_retries=2) as judge:
        grades = judge.grade_prefixes(GRADED)
        stats = judge.stats.snapshot()
    assert grades == [None, None]
    assert stats["failures"] == 2 and stats["attempts"] == 6  # every attempt made, then unscorable


def test_the_transport_and_the_classifier_treat_a_pathological_body_as_a_malformed_answer():
    transport = OpenAIHTTPTransport("openai/m", "http://127.0.0.1:9/v1", 5.0, None, {})
    for body in (DEEP, b"\xff\xfe not utf-8", b"[1, 2", b'"just a string"'):
        with pytest.raises(MalformedReplyError):
            transport._reply(body)
    assert classify(RecursionError("maximum recursion depth exceeded")) == "retry"


def test_a_parser_that_raises_counts_an_unreadable_answer_and_does_not_escape(caplog):
    def exploding(text):
        raise RecursionError("a parser bug met a pathological answer")

    with JudgeServer() as server, judge_for(server, transport="openai_http", num_retries=1) as judge:
        assert judge._batch([([{"role": "user", "content": "hi"}], exploding)]) == [None]
        stats = judge.stats.snapshot()
    assert stats["unparseable"] == 2 and stats["failures"] == 1 and "RecursionError" in caplog.text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_zero_prompt_tokens_is_unknown_usage_on_both_transports(transport):
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    with JudgeServer(usage=usage) as server, judge_for(server, transport=transport) as judge:
        assert judge.grade_prefixes(GRADED) == [[True, False, False], [False, True, True]]
        stats = judge.stats.snapshot()
    assert stats["usage_unknown"] == 2 and stats["estimated_tokens"] > 0  # the token budget still counts them
    assert token_counts(0, 7) == (0, 0, False) and token_counts(12, 0) == (12, 0, True)


@pytest.mark.parametrize("price", [math.nan, -1.58, math.inf, "n/a"])
def test_a_price_table_that_lies_leaves_the_answer_unpriced(monkeypatch, price):
    import litellm

    monkeypatch.setattr(litellm, "cost_per_token", lambda **_: (price, 0.0))
    assert checked_cost(price) is None and checked_cost(0.25) == 0.25
    with JudgeServer() as server, judge_for(server, transport="openai_http", max_cost_usd=0.01) as judge:
        judge.grade_prefixes(GRADED)
        stats = judge.stats.snapshot()
    assert stats["cost"] == 0.0 and stats["cost_unknown"] == 2

    from ppm_trl.estimate.measure import judge_prices

    prices, source = judge_prices("openai/scripted-judge", 100, 10)
    assert prices.prompt_usd is None and "not a finite amount" in source


def test_the_configured_model_sets_the_price_not_the_model_the_server_names(monkeypatch):
    import litellm

    asked = []
    monkeypatch.setattr(litellm, "cost_per_token", lambda model, **_: asked.append(model) or (0.001, 0.002))

    def claims_gpt4o(body):
        reply = {"choices": [{"message": {"content": scripted_judge(body)}}], "model": "gpt-4o",
                 "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
        return json.dumps(reply).encode()

    for transport in TRANSPORTS:
        asked.clear()
        with JudgeServer(raw_reply=claims_gpt4o) as server, judge_for(server, transport=transport) as judge:
            judge.grade_prefixes(GRADED[:1])
            assert judge.stats.snapshot()["cost"] == pytest.approx(0.003)
        assert set(asked) == {"openai/scripted-judge"}, transport


# ------------------------------------------------------------------------------------------------------------ fuzz
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
USAGE_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True),
                        st.text(max_size=5), JSON)


@st.composite
def answers(draw) -> bytes:
    """A 200 body: a chat completion with odd content and usage, a random JSON value, deep nesting, or bytes."""
    kind = draw(st.sampled_from(["completion", "json", "deep", "bytes"]))
    if kind == "completion":
        content = draw(st.one_of(st.text(max_size=200), JSON,
                                 st.sampled_from(["1. yes\n2. no\n3. yes", "\\boxed{1}", "1. YES 2. no"])))
        usage = {"prompt_tokens": draw(USAGE_VALUE), "completion_tokens": draw(USAGE_VALUE)}
        body = {"choices": draw(st.sampled_from([[{"message": {"content": content}}], [], None, [{}]])),
                "usage": draw(st.sampled_from([usage, None, [], "n/a"]))}
        return json.dumps(body, allow_nan=True).encode(draw(st.sampled_from(["utf-8", "utf-16", "latin-1"])),
                                                        errors="replace")
    if kind == "json":
        return json.dumps(draw(JSON), allow_nan=True).encode()
    if kind == "deep":
        depth = draw(st.integers(900, 60_000))
        return draw(st.sampled_from([b"[", b'{"a":'])) * depth
    return draw(st.binary(max_size=300))


def test_any_answer_is_a_grade_or_an_unscorable_attempt_and_every_count_stays_a_number():
    served: list[bytes] = [b""]
    with JudgeServer(raw_reply=lambda _: served[0]) as server, judge_for(server, transport="openai_http",
                                                                           num_retries=0) as judge:

        @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(body=answers())
        def check(body):
            served[0] = body
            grades = judge.grade_prefixes(GRADED[:1])
            assert grades == [None] or (isinstance(grades[0], list) and all(isinstance(g, bool) for g in grades[0]))
            stats = judge.stats.snapshot()
            assert all(math.isfinite(value) for value in stats.values() if isinstance(value, (int, float)))

        check()


def test_litellm_reads_its_bundled_price_table_unless_told_otherwise(monkeypatch):
    """Issue 44: without HF_HUB_OFFLINE every command fetched LiteLLM's price map (three tries, ~10 s offline)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_LOCAL_MODEL_COST_MAP", "HF_HUB_OFFLINE")}
    probe = "from ppm_trl.judge.transport import import_litellm; import os; import_litellm(); " \
            "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])"
    said = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert said.stdout.strip() == "True", said.stderr[-2000:]
    assert "cost map" not in said.stderr.lower()  # no fetch attempted, nothing warned
