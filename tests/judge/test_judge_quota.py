"""The judge at scale: run-wide rate and token limits split over processes (fake clock), a server's Retry-After and
x-ratelimit headers as the source of truth, identical requests sent once (within a batch, across batches in flight,
across processes sharing a cache), the cost/token budget in training and in `prepare`."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from types import SimpleNamespace

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer  # noqa: E402

from ppm_trl.judge import LiteLLMJudge  # noqa: E402
from ppm_trl.judge.limits import (  # noqa: E402
    RateLimiter,
    TokenBucket,
    duration_seconds,
    estimate_tokens,
    exhausted_for,
    process_count,
)

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']
FAST = dict(timeout=10.0, backoff_base=0.005, backoff_max=2.0)


@pytest.fixture(autouse=True)
def dummy_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def http_judge(server, **kwargs) -> LiteLLMJudge:
    options = dict(FAST, max_concurrency=16, transport="openai_http", cache_dir=None) | kwargs
    return LiteLLMJudge("openai/scripted-judge", api_base=server.api_base, **options)


# ------------------------------------------------------------------------------------------ token bucket
def test_token_bucket_serves_a_burst_then_the_steady_rate_in_arrival_order():
    bucket = TokenBucket(rate=2.0, capacity=3.0)  # starts full
    waits = [bucket.reserve(1, now=0.0) for _ in range(6)]
    assert waits == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]  # the 4th waits for the first refilled unit, and so on
    bucket = TokenBucket(rate=2.0, capacity=3.0)
    bucket.reserve(3, now=0.0)
    assert bucket.reserve(1, now=10.0) == 0.0 and bucket.level == 2.0  # refill stops at capacity
    assert bucket.reserve(5, now=10.0) == pytest.approx(1.5)  # more than a burst: waits, never refused
    bucket.adjust(-100, now=10.0)  # a refund never lifts it above capacity
    assert bucket.level == 3.0
    bucket.reserve(1, now=9.0)  # a clock that steps back does not refill
    assert bucket.level == 2.0
    with pytest.raises(ValueError, match="rate > 0 and capacity > 0"):
        TokenBucket(rate=0, capacity=1)


@pytest.mark.parametrize("rpm,burst_seconds", [(60, 1.0), (600, 1.0), (600, 5.0), (37, 0.1), (6000, 0.5)])
def test_requests_in_any_minute_never_exceed_the_quota_plus_one_burst(rpm, burst_seconds):
    """Arrivals at random moments (bursty and idle phases); each is sent when the limiter says. Over every 60 s
    window of send times there are at most rpm + burst requests; and the limiter does not throttle below the rate."""
    import random

    rng = random.Random(rpm)
    limiter = RateLimiter(max_rpm=rpm, burst_seconds=burst_seconds)
    burst = limiter.requests.capacity
    now, sends = 0.0, []
    for _ in range(rpm * 4):
        now += rng.choice([0.0, 0.0, 0.001, rng.expovariate(rpm / 60 * 0.8), 30.0 * rng.random() ** 8])
        sends.append(now + limiter.plan(0, now))
    start = 0
    worst = 0
    for end in range(len(sends)):
        while sends[end] - sends[start] >= 60.0:
            start += 1
        worst = max(worst, end - start + 1)
    assert worst <= rpm + burst
    assert sends == sorted(sends)  # first come, first served
    # Saturated: a backlog of 10 minutes' worth goes out at the configured rate (not slower).
    limiter = RateLimiter(max_rpm=rpm, burst_seconds=burst_seconds)
    last = max(limiter.plan(0, 0.0) for _ in range(rpm * 10))
    assert last == pytest.approx((rpm * 10 - burst) / (rpm / 60), rel=1e-6)


def test_tokens_per_minute_reserve_an_estimate_and_settle_on_usage():
    limiter = RateLimiter(max_tpm=6000, burst_seconds=1.0)  # 100 tokens/s, a burst of 100
    assert limiter.plan(80, 0.0) == 0.0
    assert limiter.plan(80, 0.0) == pytest.approx(0.6)  # 60 tokens short at 100/s
    clock = SimpleNamespace(now=0.0)
    limiter = RateLimiter(max_tpm=6000, clock=lambda: clock.now)
    limiter.plan(80, 0.0)
    limiter.settle(estimate=80, used=20)  # the answer was shorter: 60 tokens given back
    assert limiter.tokens.level == pytest.approx(80)
    limiter.settle(estimate=20, used=300)  # longer: the debt delays later requests
    assert limiter.plan(1, 0.0) == pytest.approx(2.01)
    assert estimate_tokens([{"role": "user", "content": "x" * 400}], max_tokens=50) == 100 + 8 + 50
    assert estimate_tokens([{"role": "user", "content": "x" * 400}], max_tokens=None) == 100 + 8 + 64


def test_a_server_pause_holds_waiting_and_later_requests_with_a_fake_clock():
    clock = SimpleNamespace(now=0.0, slept=[])

    async def fake_sleep(seconds):
        clock.slept.append(seconds)
        clock.now += seconds
        if len(clock.slept) == 1:  # a 429 with Retry-After 5 arrives while this request waits
            limiter.pause_until(clock.now + 5.0)

    limiter = RateLimiter(max_rpm=60, burst_seconds=1.0, clock=lambda: clock.now, sleep=fake_sleep)
    assert asyncio.run(limiter.acquire()) == 0.0 and clock.slept == []
    waited = asyncio.run(limiter.acquire())  # the bucket says 1 s; the pause then says 5 s more
    assert clock.slept == [1.0, 5.0] and waited == pytest.approx(6.0)
    limiter.pause_until(clock.now - 100)  # an older deadline never shortens a pause
    assert limiter.paused_until == pytest.approx(6.0)


@pytest.mark.parametrize("text,seconds", [("1", 1.0), ("1.5", 1.5), ("20ms", 0.02), ("6m0s", 360.0),
                                          ("1h2m3.5s", 3723.5), ("0s", 0.0)])
def test_reset_durations_as_servers_write_them(text, seconds):
    assert duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "1s2", "m", "1 s", "-3", "nan", "inf", "-inf", "1e400"])
def test_unreadable_reset_durations_are_ignored(text):
    assert duration_seconds(text) is None


def test_exhausted_quota_headers():
    assert exhausted_for({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2s"}) == 2.0
    assert exhausted_for({"X-RateLimit-Remaining-Tokens": "0", "X-RateLimit-Reset-Tokens": "150ms",
                          "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}) == 1.0
    # LiteLLM passes a provider's headers on with an `llm_provider-` prefix
    assert exhausted_for({"llm_provider-x-ratelimit-remaining-requests": "0",
                          "llm_provider-x-ratelimit-reset-requests": "3"}) == 3.0
    assert exhausted_for({"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "2s"}) is None
    assert exhausted_for({"x-ratelimit-remaining-requests": "0"}) is None  # no reset given: nothing to go by
    assert exhausted_for({"x-ratelimit-remaining-requests": "n/a", "x-ratelimit-reset-requests": "2s"}) is None
    assert exhausted_for({}) is None


# ------------------------------------------------------------------------------------- process shares
def test_limits_are_run_totals_split_over_the_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert process_count() == 4
    judge = LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", max_concurrency=64, max_rpm=600,
                         max_tpm=120_000)
    assert judge.process_concurrency == 16
    assert judge._limiter.requests.rate == pytest.approx(600 / 4 / 60)
    assert judge._limiter.tokens.rate == pytest.approx(120_000 / 4 / 60)
    explicit = LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", max_concurrency=3, processes=8)
    assert explicit.process_concurrency == 1 and not explicit._limiter.active  # never below one
    monkeypatch.setenv("WORLD_SIZE", "garbage")
    assert process_count() == 1
    for bad in (dict(max_rpm=0), dict(max_tpm=-5), dict(max_rpm=float("nan")), dict(max_cost_usd=True),
                dict(max_total_tokens="100"), dict(burst_seconds=0), dict(processes=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", **bad)


def test_config_limits_reach_the_judge():
    from helpers import TINY_ARGS

    from ppm_trl.ppm.ppm_config import PPMConfig

    args = PPMConfig(output_dir="/tmp/x", judge_max_rpm=300, judge_max_tpm=9000, judge_burst_seconds=2.0,
                     judge_max_cost_usd=1.5, judge_max_total_tokens=10_000, num_generations=4,
                     per_device_train_batch_size=4, **TINY_ARGS)
    kwargs = args.judge_kwargs(args.output_dir)
    assert (kwargs["max_rpm"], kwargs["max_tpm"], kwargs["burst_seconds"], kwargs["max_cost_usd"],
            kwargs["max_total_tokens"]) == (300, 9000, 2.0, 1.5, 10_000)


# ------------------------------------------------------------------------------- against a quota server
def distinct_items(n):
    return [("P", POINTS, f"alpha {index}") for index in range(n)]


def test_the_limiter_keeps_a_real_server_within_its_quota_and_nothing_is_lost():
    """Quota 20 requests per 0.5 s window (a minute, scaled down). Without the limiter 120 concurrent requests meet
    429s; with max_rpm at the quota minus the burst the server never counts more than its quota and every
    answer arrives (honouring Retry-After)."""
    quota, window = 20, 0.5
    items = distinct_items(120)
    with JudgeServer(quota=(quota, window)) as server:
        with http_judge(server, num_retries=30) as judge:
            assert all(judge.grade_prefixes(items))
        unlimited_429 = server.quota_rejections
        server.reset_counters()
        rpm = (quota - 4) * 60 / window  # room for the burst and for arrivals that bunch up on the way
        with http_judge(server, num_retries=30, max_rpm=rpm, burst_seconds=2 * window / quota) as judge:
            grades = judge.grade_prefixes(items)
            stats = judge.stats.snapshot()
        assert all(grade == [True, False, False] for grade in grades)
        assert server.max_in_window(window, admitted_only=False) <= quota
        assert server.quota_rejections == 0 and stats["throttled"] == 0 and stats["failures"] == 0
        assert stats["rate_limit_wait_s"] > 0
    assert unlimited_429 > 0  # the control: the same load without the limiter is throttled


def limiter_on_a_fake_clock(judge: LiteLLMJudge) -> SimpleNamespace:
    """The judge's rate limiter on a clock that moves only when the limiter sleeps: its pauses are counted exactly,
    never timed (the retry back-off still sleeps for real)."""
    clock = SimpleNamespace(now=0.0, slept=[])

    async def fake_sleep(seconds):
        clock.slept.append(seconds)
        clock.now += seconds
        await asyncio.sleep(0)

    judge._limiter.clock, judge._limiter.sleep = (lambda: clock.now), fake_sleep
    return clock


def test_retry_after_pauses_every_request_of_the_process():
    """One 429 with Retry-After: the requests waiting behind it hold too, instead of each meeting its own 429."""
    with JudgeServer(script=("rate_limit",), retry_after="0.3", latency=0.05) as server:
        with http_judge(server, max_concurrency=1) as judge:  # no limits configured: the server's word still holds
            clock = limiter_on_a_fake_clock(judge)
            judge.grade_prefixes(distinct_items(6))
            stats = judge.stats.snapshot()
    assert server.faults["rate_limit"] == 1 and stats["throttled"] == 1
    # The next request waited out the server's whole pause, once; nothing else waited.
    assert clock.slept == [pytest.approx(0.3)] and stats["rate_limit_wait_s"] == pytest.approx(0.3)
    assert server.requests == 7 and stats["failures"] == 0


def test_exhausted_headers_on_a_success_pause_the_next_request():
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "400ms"}

    class Exhausted(JudgeServer):
        async def _respond(self, request_line, request_headers, raw):
            status, extra, payload = await super()._respond(request_line, request_headers, raw)
            return status, extra | headers, payload

    with Exhausted() as server:
        with http_judge(server, max_concurrency=1, max_rpm=60_000) as judge:
            clock = limiter_on_a_fake_clock(judge)
            judge.grade_prefixes(distinct_items(3))
            stats = judge.stats.snapshot()
    # Each answer says "0 left, reset in 400 ms": the 2nd and 3rd requests each wait exactly that (the bucket of
    # 60,000 per minute alone would not make them wait).
    assert clock.slept == [pytest.approx(0.4)] * 2 and stats["rate_limit_wait_s"] == pytest.approx(0.8)
    assert stats["throttled"] == 0 and server.requests == 3


# ---------------------------------------------------------------------------------------- de-duplication
def test_identical_requests_of_concurrent_batches_are_sent_once():
    items = distinct_items(5)
    with JudgeServer(latency=0.3) as server:
        with http_judge(server) as judge:
            async def two_scorers():
                return await asyncio.gather(judge.agrade_prefixes(items), judge.agrade_prefixes(items[::-1]))

            first, second = judge.run(two_scorers)
            stats = judge.stats.snapshot()
    assert first == second[::-1] and all(first)
    assert server.requests == 5 and stats["calls"] == 5 and stats["deduplicated"] == 5


def as_two_ranks(make_judge, items) -> tuple[list, list]:
    """Two judges grading `items` at the same time in two threads: (their grades, their stats snapshots)."""
    judges = [make_judge() for _ in range(2)]
    results, stats = [None, None], [None, None]

    def rank(index):
        results[index] = judges[index].grade_prefixes(items)
        stats[index] = judges[index].stats.snapshot()

    threads = [threading.Thread(target=rank, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for judge in judges:
        judge.close()
    return results, stats


def test_identical_requests_of_two_processes_sharing_a_cache_are_sent_once(tmp_path):
    """Two judges with one cache directory stand for two ranks (file locks conflict between them as between
    processes); each grades the same rollouts at the same time."""
    items = distinct_items(6)
    with JudgeServer(latency=0.3) as server:
        results, stats = as_two_ranks(lambda: http_judge(server, cache_dir=tmp_path / "cache"), items)
    assert results[0] == results[1] and all(results[0])
    assert server.requests == 6  # each distinct request once, whichever rank sent it
    assert stats[0]["calls"] + stats[1]["calls"] == 6
    assert stats[0]["shared_across_processes"] + stats[1]["shared_across_processes"] == 6
    assert not any((tmp_path / "cache" / "claims").rglob("*.lock"))  # every claim released and removed


def test_a_claim_whose_holder_got_no_answer_is_sent_by_the_waiter(tmp_path):
    """The first holder's request fails (400, not retried): the waiting process must not take 'no cache entry'
    as an answer; it sends the request itself."""
    with JudgeServer(script=("bad_request",), latency=0.2) as server:
        results, _ = as_two_ranks(lambda: http_judge(server, cache_dir=tmp_path / "cache", num_retries=0),
                                  distinct_items(1))
    assert sorted(map(str, results)) == ["[None]", "[[True, False, False]]"]
    assert server.requests == 2


# -------------------------------------------------------------------------------------------- budget
def test_budget_reasons():
    judge = LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", max_total_tokens=1000, max_cost_usd=0.5)
    assert judge.budget_exhausted() is None
    judge.stats.add(prompt_tokens=600, completion_tokens=399)
    assert judge.budget_exhausted() is None
    judge.stats.add(completion_tokens=1)
    assert "1,000 tokens" in judge.budget_exhausted() and "judge_max_total_tokens" in judge.budget_exhausted()
    assert "$0.5" in judge.budget_exhausted(cost_usd=0.5, tokens=0, unpriced=0)
    assert "could not be priced" in judge.budget_exhausted(cost_usd=0.1, tokens=0, unpriced=3)
    assert LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1").budget_exhausted(tokens=10**12) is None


def test_budget_callback_stops_after_the_step_and_saves():
    from transformers import TrainerControl

    from ppm_trl.judge.budget import JudgeBudgetCallback

    judge = LiteLLMJudge("openai/x", api_base="http://127.0.0.1:1/v1", max_total_tokens=100)
    callback = JudgeBudgetCallback(judge)
    state = SimpleNamespace(global_step=3, is_world_process_zero=True)
    control = callback.on_step_end(SimpleNamespace(save_strategy="steps", output_dir="out"), state, TrainerControl())
    assert not control.should_training_stop and not control.should_save
    judge.stats.add(prompt_tokens=150)
    control = callback.on_step_end(SimpleNamespace(save_strategy="steps", output_dir="out"), state, TrainerControl())
    assert control.should_training_stop and control.should_save
    assert "step 3" in callback.stopped and "150 tokens" in callback.stopped
    control = JudgeBudgetCallback(judge).on_step_end(SimpleNamespace(save_strategy="no", output_dir="out"), state,
                                                     TrainerControl())
    assert control.should_training_stop and not control.should_save


def test_training_stops_at_the_step_that_spends_the_budget_with_a_checkpoint(tmp_path, monkeypatch):
    from helpers import build_trainer, script_generation
    from test_ppm_judge_integration import G, K, _completions, _dataset, _outcome

    with JudgeServer() as server:
        trainer = build_trainer(
            "ppm", tmp_path / "out", reward_funcs=_outcome, train_dataset=_dataset(), per_device_train_batch_size=4,
            num_generations=G, max_completion_length=64, num_segments=K, max_steps=4,
            filter_zero_advantage_groups=False, progress_scorer="judge", judge_model="openai/loopback-judge",
            judge_api_base=server.api_base, judge_cache_dir=str(tmp_path / "cache"), judge_timeout=10,
            judge_max_total_tokens=1, save_strategy="steps", save_steps=100)
        script_generation(trainer, lambda prompt, index: _completions()[index % G])
        trainer.train()
    assert trainer.state.global_step == 1  # stopped after the first step, not in it
    assert (tmp_path / "out" / "checkpoint-1").is_dir()


# ------------------------------------------------------------------------------------------- prepare
def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def prepare_args(data, server, out, *extra):
    return ["--dataset", str(data), "--problem-column", "problem", "--reference-column", "solution", "--judge-model", "openai/scripted-judge",
            "--api-base", server.api_base, "--out", str(out), "--num-retries", "0", "--timeout", "10",
            "--max-concurrency", "4", "--no-progress", "--no-judge-probe", *extra]


ROW_A = {"problem": "What is 2 + 3?", "solution": "Add 2 and 3.\nSo \\boxed{5}."}
ROW_B = {"problem": "What is 4 * 2?", "solution": "Multiply 4 by 2.\nThe product is \\boxed{8}."}


def test_prepare_judges_duplicate_rows_once(tmp_path, capsys):
    import datasets

    from ppm_trl.prepare import main

    data = tmp_path / "rows.jsonl"
    write_rows(data, [ROW_A, ROW_B, ROW_A, ROW_A, ROW_B, dict(ROW_A, solution=ROW_A["solution"] + " ")])
    with JudgeServer() as server:
        main(prepare_args(data, server, tmp_path / "out"))
        requests = server.requests
    prepared = datasets.load_from_disk(str(tmp_path / "out"))
    assert len(prepared) == 6
    assert prepared[0]["reasoning_points"] == prepared[2]["reasoning_points"] == prepared[3]["reasoning_points"]
    # Three distinct rows (the last differs in its reference): three rubric requests; the last row's rubric equals
    # the first's, so its graph request is the first's (answered once): two graph requests.
    assert requests == 3 + 2
    assert "3 row(s) repeat an earlier row" in capsys.readouterr().out


def test_prepare_stops_starting_rows_when_the_budget_is_spent_and_resumes(tmp_path, capsys):
    import datasets

    from ppm_trl.prepare import main

    data = tmp_path / "rows.jsonl"
    write_rows(data, [dict(ROW_A, problem=f"What is {i} + 3?") for i in range(6)])
    with JudgeServer() as server:
        with pytest.raises(SystemExit) as exited:
            main(prepare_args(data, server, tmp_path / "out", "--max-total-tokens", "1", "--max-concurrency", "1"))
        assert exited.value.code == 3  # a budget stop has its own exit status (issue 33 item 5)
        err = capsys.readouterr().err
        # --max-concurrency 1 lets two rows be in flight: both finish, then no new row starts
        assert "--max-total-tokens=1" in err and "judge_max" not in err and "stopped after 2 prepared rows" in err
        assert len(datasets.load_from_disk(str(tmp_path / "out"))) == 2  # the prepared rows are written
        assert server.requests == 4
        main(prepare_args(data, server, tmp_path / "out"))  # a rerun without the budget finishes the rest
    assert len(datasets.load_from_disk(str(tmp_path / "out"))) == 6


# ------------------------------------------------------- transport: redirects, usage LiteLLM cannot read
class Redirector(JudgeServer):
    """Answers every request with a redirect to `target` (another origin)."""

    target = ""
    status = "307 Temporary Redirect"

    async def _respond(self, request_line, headers, raw):
        with self._lock:
            self.requests += 1
        return self.status, {"Location": self.target}, {"error": "moved"}


@pytest.mark.parametrize("transport,model", [("litellm", "openai/x"), ("litellm", "hosted_vllm/x"),
                                             ("openai_http", "openai/x"), ("openai_http", "hosted_vllm/x")])
@pytest.mark.parametrize("status", ["307 Temporary Redirect", "308 Permanent Redirect", "302 Found"])
def test_a_redirect_to_another_server_is_never_followed_and_names_its_location(transport, model, status):
    with JudgeServer() as elsewhere, Redirector() as front:
        front.target = elsewhere.api_base + "/chat/completions"
        front.status = status
        judge = LiteLLMJudge(model, api_base=front.api_base, transport=transport, num_retries=2, timeout=5,
                             backoff_base=0.001, backoff_max=0.01)
        with judge:
            assert judge.complete([[{"role": "user", "content": "grade this"}]]) == [None]
        assert elsewhere.requests == 0  # the prompt never reached the other origin
        assert front.requests == 1  # not retried: the same answer would come back
        assert front.target in judge.last_failure.reason and "not followed" in judge.last_failure.reason


MALFORMED_USAGE = [7, [1, 2], "", {"prompt_tokens": 1.5, "completion_tokens": 3, "total_tokens": 4.5},
                   {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": "two"},
                   {"prompt_tokens": {"a": 1}, "completion_tokens": 1}, {"prompt_tokens": -1, "completion_tokens": 2}]


@pytest.mark.parametrize("model", ["openai/x", "hosted_vllm/x"])
@pytest.mark.parametrize("usage", MALFORMED_USAGE, ids=lambda usage: repr(usage)[:30])
def test_usage_litellm_rejects_never_fails_an_answer_through_litellm(model, usage):
    with JudgeServer(usage=usage) as server:
        judge = LiteLLMJudge(model, api_base=server.api_base, transport="litellm", num_retries=2, timeout=5,
                             backoff_base=0.001, backoff_max=0.01)
        with judge:
            grades = judge.grade_prefixes([("P", POINTS, "alpha")])
            stats = judge.stats.snapshot()
    assert grades == [[True, False, False]]
    assert (stats["attempts"], stats["failures"]) == (1, 0)


def test_prepare_without_a_cache(tmp_path):
    from ppm_trl.prepare import main

    data = tmp_path / "rows.jsonl"
    write_rows(data, [ROW_A, ROW_B])
    with JudgeServer() as server:
        main(prepare_args(data, server, tmp_path / "out", "--cache-dir", "none"))
        main(prepare_args(data, server, tmp_path / "out2", "--cache-dir", "none"))
        assert server.requests == 2 * 4  # nothing cached: the second run asks again
    assert not os.path.exists("none") and not (tmp_path / "out" / "judge_cache").exists()


def test_the_done_line_says_why_the_budget_ended_training(capsys):
    from ppm_trl.train import report_done

    stopped = SimpleNamespace(stopped="judge budget spent at step 1: the judge used 9 tokens")
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[SimpleNamespace(), stopped]),
                              state=SimpleNamespace(log_history=[]), args=SimpleNamespace())
    report_done("ppm-trl train", {"output_dir": "/abs/out"}, trainer, SimpleNamespace(env_name="multi_add", env_n=2))
    err = capsys.readouterr().err
    assert "ppm-trl train: stopped early (exit status 3): judge budget spent at step 1" in err
