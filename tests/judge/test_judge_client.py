"""LiteLLMJudge against a real loopback HTTP server speaking the OpenAI chat-completions protocol."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import threading
from types import SimpleNamespace

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer  # noqa: E402

from ppm_trl.judge import JudgeConfigurationError, LiteLLMJudge  # noqa: E402

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']
FAST = dict(timeout=5.0, backoff_base=0.005, backoff_max=0.02)  # keep retries quick in tests


@pytest.fixture(autouse=True)
def dummy_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")


@pytest.fixture
def server():
    with JudgeServer() as running:
        yield running


def make_judge(server, tmp_path=None, **kwargs) -> LiteLLMJudge:
    options = dict(FAST, max_concurrency=16, cache_dir=None if tmp_path is None else tmp_path / "cache")
    options.update(kwargs)
    return LiteLLMJudge(options.pop("model", "openai/scripted-judge"), api_base=server.api_base, **options)


def expected_grades(prefix: str) -> list[bool]:
    return [token in prefix for token in ("alpha", "beta", "gamma")]


def test_grades_dedup_and_empty_prefixes(server):
    items = [
        ("P", POINTS, "alpha then gamma"),
        ("P", POINTS, ""),
        ("P", POINTS, "beta"),
        ("P", POINTS, "alpha then gamma"),  # identical request: sent once
        ("P", POINTS, "   "),
    ]
    with make_judge(server) as judge:
        grades = judge.grade_prefixes(items)
        stats = judge.stats.snapshot()
    assert grades == [[True, False, True], [False] * 3, [False, True, False], [True, False, True], [False] * 3]
    assert server.requests == 2
    assert (stats["requests"], stats["deduplicated"], stats["skipped_empty"], stats["calls"]) == (3, 1, 2, 2)
    assert all(m["messages"][0]["role"] == "system" for m in server.bodies)
    assert all(body["temperature"] == 0.0 for body in server.bodies)


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_second_identical_run_is_served_from_cache(server, tmp_path, transport):
    items = [("P", POINTS, f"try {i}: alpha") for i in range(12)]
    with make_judge(server, tmp_path, transport=transport) as judge:
        first = judge.grade_prefixes(items)
    assert server.requests == 12
    server.reset_counters()
    with make_judge(server, tmp_path, transport=transport) as fresh:  # a new process would see the same files
        second = fresh.grade_prefixes(items)
        assert fresh.stats.cache_hits == 12 and fresh.stats.calls == 0
    assert server.requests == 0
    assert second == first == [[True, False, False]] * 12


def test_cache_key_covers_sampling_parameters(server, tmp_path):
    items = [("P", POINTS, "alpha")]
    with make_judge(server, tmp_path) as judge:
        judge.grade_prefixes(items)
    with make_judge(server, tmp_path, temperature=0.7) as warmer, make_judge(server, tmp_path, max_tokens=512) as capped:
        warmer.grade_prefixes(items)
        capped.grade_prefixes(items)
    assert server.requests == 3
    assert server.bodies[2]["max_tokens"] == 512


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_reliability_with_twenty_percent_faults(transport):
    items = [("P", POINTS, f"attempt {i}: " + ("alpha " if i % 2 else "") + ("gamma" if i % 3 else "")) for i in range(256)]
    # The client timeout must exceed the CPU queueing of the requests in flight (LiteLLM spends a few ms of CPU
    # on each, more on a busy machine), or a slow client would time out answers the server sent in time.
    concurrency = 16 if transport == "litellm" else 64
    with JudgeServer(fault_rate=0.2, seed=7, timeout_delay=3.0) as server:
        with make_judge(server, max_concurrency=concurrency, num_retries=4, timeout=2.0, transport=transport) as judge:
            grades = judge.grade_prefixes(items)
            stats = judge.stats.snapshot()
        faults = dict(server.faults)
        assert sum(faults.values()) > 20 and set(faults) == {"rate_limit", "server_error", "timeout", "garbage"}
        assert len(grades) == 256
        for (_, _, prefix), grade in zip(items, grades):
            assert grade is None or grade == expected_grades(prefix)  # graded right, or reported unscorable
        assert sum(g is None for g in grades) == stats["failures"]
        # Every injected fault was retried, except the last attempt of an item that gave up.
        assert stats["retries"] + stats["failures"] == sum(faults.values())
        assert stats["attempts"] == server.requests == 256 + stats["retries"]  # no hidden retries in LiteLLM
        assert stats["unparseable"] == faults["garbage"]


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_unrecoverable_items_are_none_and_counted(caplog, transport):
    with JudgeServer(fault_rate=1.0, fault_kinds=("server_error",)) as server:
        with make_judge(server, num_retries=2, transport=transport) as judge, caplog.at_level(logging.WARNING):
            grades = judge.grade_prefixes([("P", POINTS, "alpha"), ("P", POINTS, "beta")])
            assert grades == [None, None]
            assert (judge.stats.failures, judge.stats.retries, judge.stats.attempts) == (2, 4, 6)
        assert server.requests == 6
    assert "unscorable after 3 attempt(s)" in caplog.text


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_bad_request_fails_the_item_without_retry_and_401_is_fatal(transport):
    with JudgeServer(script=("bad_request",)) as server, make_judge(server, transport=transport) as judge:
        assert judge.grade_prefixes([("P", POINTS, "alpha")]) == [None]
        assert server.requests == 1 and judge.stats.retries == 0
    with JudgeServer(fault_rate=1.0, fault_kinds=("unauthorized",)) as server, \
            make_judge(server, transport=transport) as judge:
        with pytest.raises(JudgeConfigurationError, match=r"refused or is missing \(HTTP 401\); key variable OPENAI_API_KEY is set"):
            judge.grade_prefixes([("P", POINTS, "alpha")])
        assert server.requests == 1


def record_backoffs(judge) -> list[tuple[float | None, float]]:
    """(Retry-After the judge read, seconds it then waited) for every retry: counted, not timed."""
    waits, backoff = [], judge._backoff

    def recording(attempt, retry_after):
        waits.append((retry_after, backoff(attempt, retry_after)))
        return waits[-1][1]

    judge._backoff = recording
    return waits


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_retry_after_is_honoured(transport):
    with JudgeServer(retry_after="0.6") as server:
        with make_judge(server, transport=transport, backoff_max=5.0) as judge:  # Retry-After is capped by it
            waits = record_backoffs(judge)
            server.script = ["rate_limit"]
            assert judge.grade_prefixes([("P", POINTS, "beta")]) == [[False, True, False]]
    assert server.requests == 2 and len(waits) == 1
    retry_after, waited = waits[0]
    assert retry_after == pytest.approx(0.6)  # read from the 429
    assert 0.6 <= waited <= 0.66  # the server's word (+ up to 10 % jitter); exponential back-off alone: <= 5 ms


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_api_key_never_leaks(monkeypatch, caplog, tmp_path, transport):
    secret = "sk-test-SECRET-0123456789abcdef"
    monkeypatch.setenv("MY_JUDGE_KEY", secret)
    with pytest.raises(ValueError, match="environment"):
        LiteLLMJudge("openai/x", api_key=secret)
    with pytest.raises(ValueError, match="environment"):
        LiteLLMJudge("bedrock/x", aws_secret_access_key=secret)
    with pytest.raises(ValueError, match="not set"):
        LiteLLMJudge("openai/x", api_key_env="NO_SUCH_VARIABLE_SET")
    with JudgeServer(script=("server_error", None, "unauthorized")) as server, caplog.at_level(logging.DEBUG):
        judge = make_judge(server, tmp_path, api_key_env="MY_JUDGE_KEY", transport=transport)
        assert judge.grade_prefixes([("P", POINTS, "alpha")]) == [[True, False, False]]
        with pytest.raises(JudgeConfigurationError) as raised:
            judge.grade_prefixes([("P", POINTS, "beta")])
        judge.close()
    assert server.authorization[0] == f"Bearer {secret}"  # the key was used ...
    exposed = [repr(judge), str(judge), repr(judge.stats), json.dumps(judge.config()), json.dumps(judge.stats.snapshot()),
               str(raised.value), caplog.text, str(pickle.dumps(judge))]
    exposed += [path.read_text() for path in (tmp_path / "cache").rglob("*.json")]
    assert all(secret not in text for text in exposed)  # ... and is nowhere else


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_tokens_and_cost_accounting(server, transport):
    import litellm

    prices = litellm.model_cost["gpt-4o-mini"]
    with make_judge(server, model="openai/gpt-4o-mini", transport=transport) as judge:
        judge.grade_prefixes([("P", POINTS, "alpha"), ("P", POINTS, "gamma beta")])
        stats = judge.stats.snapshot()
    assert stats["prompt_tokens"] == server.tokens_served["prompt"] > 0
    assert stats["completion_tokens"] == server.tokens_served["completion"] > 0
    expected = (stats["prompt_tokens"] * prices["input_cost_per_token"]
                + stats["completion_tokens"] * prices["output_cost_per_token"])
    assert stats["cost"] == pytest.approx(expected, rel=1e-6) and stats["cost_unknown"] == 0
    with make_judge(server, model="openai/unpriced-judge", transport=transport) as unpriced:
        unpriced.grade_prefixes([("P", POINTS, "alpha")])
        assert (unpriced.stats.cost, unpriced.stats.cost_unknown) == (0.0, 1)


def test_sync_facade_and_async_api_from_another_running_loop(server):
    judge = make_judge(server)
    results = {}

    async def trl_like_step():
        # TRL may run its own loop in another thread; both the blocking facade and the coroutine must work there.
        results["sync"] = judge.grade_prefixes([("P", POINTS, "alpha")])
        results["async"] = await judge.agrade_prefixes([("P", POINTS, "beta")])
        results["rubric"] = await judge.ascore_rubric([("P", "one\n\\boxed{4}", "one\n\\boxed{4}")])

    thread = threading.Thread(target=lambda: asyncio.run(trl_like_step()))
    thread.start()
    thread.join(60)
    assert results == {"sync": [[True, False, False]], "async": [[False, True, False]], "rubric": [1.0]}
    assert judge.grade_prefixes([("P", POINTS, "gamma")]) == [[False, False, True]]  # and from the main thread
    judge.close()
    assert judge.grade_prefixes([("P", POINTS, "alpha beta")]) == [[True, True, False]]  # a closed judge restarts
    clone = pickle.loads(pickle.dumps(judge))
    assert clone.grade_prefixes([("P", POINTS, "beta gamma")]) == [[False, True, True]]
    judge.close()
    clone.close()


def test_task_api_and_input_errors(server):
    with make_judge(server) as judge:
        reference = "Let x = 2.\nThen y = x + 3.\nSo \\boxed{5}."
        assert judge.score_rubric([("P", reference, reference), ("P", reference, "guess \\boxed{5}"),
                                   ("P", reference, "guess \\boxed{6}")]) == [1.0, 0.5, 0.0]
        points = judge.generate_points("P", reference, answer="5")
        assert points == ['The solution states "Let x = 2.".', 'The solution states "Then y = x + 3.".',
                          "The solution concludes that the answer is \\boxed{5}."]
        assert judge.generate_points("P", reference, answer="7") is None  # last point must state the answer
        assert judge.generate_graph("P", points) == [{"if_all": [2], "makes_obsolete": [1]}]
        standard = judge.grade_prefixes([("P", POINTS, "gamma, alpha"), ("P", POINTS, "")], style="standard")
        assert standard == [[True, False, True], [False, False, False]]  # the §5.3 'standard rubric' baseline prompt
        assert judge.review_process([("P", ["fine", "an ERROR"]), ("P", "fine")]) == [False, True]
        with pytest.raises(ValueError, match="item 1"):
            judge.grade_prefixes([("P", POINTS, "a"), ("P", [], "b")])
        with pytest.raises(ValueError, match="item 0"):
            judge.grade_prefixes(["just a string"])
        with pytest.raises(ValueError, match="tier"):
            judge.score_rubric([("P", "R", "S")], tier="ten_tier")
    with pytest.raises(ValueError, match="max_concurrency"):
        LiteLLMJudge("openai/x", max_concurrency=0)
    with pytest.raises(ValueError, match="transport"):
        LiteLLMJudge("gemini/gemini-2.5-flash-lite", transport="openai_http")


def test_stats_callback_logs_per_step_deltas(server):
    from transformers import TrainerState

    from ppm_trl.judge import JudgeStatsCallback

    with make_judge(server) as judge:
        callback = JudgeStatsCallback(judge)
        trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=["reporting", "printer"]))
        callback.install(trainer)
        callback.install(trainer)
        assert trainer.callback_handler.callbacks == [callback, "reporting", "printer"]
        state = TrainerState()
        judge.grade_prefixes([("P", POINTS, "alpha"), ("P", POINTS, "beta"), ("P", POINTS, "alpha")])
        state.global_step = 1
        logs = {"loss": 1.0}
        state.log_history.append({**logs, "step": 1})
        callback.on_log(None, state, None, logs=logs)
        assert (logs["judge/calls"], logs["judge/cache_hits"], logs["judge/failures"], logs["judge/retries"]) == (2, 0, 0, 0)
        assert 0 < logs["judge/latency_p50"] <= logs["judge/latency_p95"] and logs["judge/cost"] == 0.0
        assert logs["judge/usage_unknown"] == 0 and logs["judge/cache_rejected"] == 0  # logged, also when 0
        assert state.log_history[-1]["judge/calls"] == 2
        quiet = {"loss": 0.5}
        callback.on_log(None, state, None, logs=quiet)
        assert quiet["judge/calls"] == 0 and "judge/latency_p50" not in quiet  # nothing happened: no fake latency


def test_two_judges_in_two_threads_share_one_loop(server, caplog):
    # LiteLLM binds process-wide state to one event loop; judges used concurrently must not fight over it.
    first, second, results = make_judge(server), make_judge(server), {}

    def grade(name, judge):
        results[name] = judge.grade_prefixes([("P", POINTS, f"{name} {i} gamma") for i in range(30)])

    with caplog.at_level(logging.ERROR):
        threads = [threading.Thread(target=grade, args=item) for item in (("first", first), ("second", second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        first.close()
        second.close()
    assert results["first"] == results["second"] == [[False, False, True]] * 30
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
