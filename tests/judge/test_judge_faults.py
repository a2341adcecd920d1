"""Judge faults from the red-team pass (issue 16), one fault kind per test on the loopback server, both transports:
a Retry-After far in the future never hangs, a 200 with junk usage never crashes a batch, a key echoed by the
server never reaches a log record or an exception, and the cache never serves another request's answer."""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import shutil
import threading
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer, scripted_judge  # noqa: E402

from ppm_trl.judge import JudgeConfigurationError, LiteLLMJudge  # noqa: E402
from ppm_trl.judge.cache import ResponseCache, request_fingerprint, request_key  # noqa: E402
from ppm_trl.judge.redaction import redact

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".', 'The solution contains "gamma".']
TRANSPORTS = ["litellm", "openai_http"]
FAST = dict(timeout=5.0, backoff_base=0.005, backoff_max=0.02, max_concurrency=8)


@pytest.fixture(autouse=True)
def dummy_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")


def judge_for(server: JudgeServer, **kwargs) -> LiteLLMJudge:
    return LiteLLMJudge("openai/scripted-judge", api_base=server.api_base, **(FAST | kwargs))


def within(seconds: float, function):
    """`function()`'s result, or a test failure if it has not returned after `seconds` (the thread is left asleep)."""
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(value=function()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return outcome["value"]


# ------------------------------------------------------------------------------------------ #16 item 1
DECADES_AHEAD = email.utils.formatdate(time.time() + 40 * 365 * 86400, usegmt=True)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("retry_after", "more_headers"), [
    ("3600", {}),  # seconds
    (DECADES_AHEAD, {}),  # an HTTP date
    (None, {"retry-after-ms": "3600000"}),  # OpenAI's millisecond header
], ids=["seconds", "http-date", "retry-after-ms"])
def test_a_long_retry_after_is_capped_by_backoff_max(transport, retry_after, more_headers):
    with JudgeServer(retry_after=retry_after, rate_limit_headers=more_headers) as server:
        judge = judge_for(server, transport=transport, backoff_max=0.05, timeout=1.5, num_retries=2)
        backoffs, pauses = [], []
        backoff, pause_until = judge._backoff, judge._limiter.pause_until
        judge._backoff = lambda attempt, retry_after: backoffs.append(backoff(attempt, retry_after)) or backoffs[-1]
        judge._limiter.pause_until = lambda deadline: (pauses.append(deadline - judge._limiter.clock()),
                                                       pause_until(deadline))
        server.script = ["rate_limit", "rate_limit"]
        # `within` only turns a hang into a failure; the waits themselves are counted below, not timed.
        assert within(60, lambda: judge.grade_prefixes([("P", POINTS, "beta")])) == [[False, True, False]]
        judge.close()
    assert server.requests == 3 and judge.stats.retries == 2
    # Two retries, each after a wait capped at backoff_max (0.05 s), and the process-wide pause each 429 asked for
    # capped alike: not the server's hour.
    assert len(backoffs) == 2 and all(0 < wait <= 0.05 for wait in backoffs)
    assert len(pauses) == 2 and all(0 < pause <= 0.05 for pause in pauses)


def test_the_backoff_cap_is_also_the_attempt_timeout():
    judge = LiteLLMJudge("openai/x", timeout=0.2, backoff_max=30.0)
    assert judge._backoff(0, 3600.0) == 0.2 and judge._backoff(10, None) <= 0.2
    assert LiteLLMJudge("openai/x", backoff_max=0.5)._backoff(0, 0.1) >= 0.1  # a short Retry-After is honoured


# ------------------------------------------------------------------------------------------ #16 item 4
BAD_USAGE = [
    {"prompt_tokens": "n/a", "completion_tokens": "n/a", "total_tokens": "n/a"},
    {"prompt_tokens": None, "completion_tokens": 3, "total_tokens": None},
    {"prompt_tokens": {"cached": [1, 2]}, "completion_tokens": [7], "total_tokens": {}},
    {"prompt_tokens": float("nan"), "completion_tokens": True},
    "n/a",
]
BAD_USAGE_IDS = ["strings", "null", "nested", "nan-and-bool", "not-an-object"]
GRADED = [("P", POINTS, "alpha"), ("P", POINTS, "gamma beta")]


@pytest.mark.parametrize("usage", BAD_USAGE, ids=BAD_USAGE_IDS)
def test_usage_that_is_not_numbers_is_counted_not_fatal(usage):
    with JudgeServer(usage=usage) as server, judge_for(server, transport="openai_http") as judge:
        grades = judge.grade_prefixes(GRADED)
        stats = judge.stats.snapshot()
    assert grades == [[True, False, False], [False, True, True]]
    assert (stats["failures"], stats["retries"], stats["usage_unknown"], stats["cost_unknown"]) == (0, 0, 2, 2)
    assert (stats["prompt_tokens"], stats["completion_tokens"], stats["cost"]) == (0, 0, 0.0)


@pytest.mark.parametrize("usage", BAD_USAGE, ids=BAD_USAGE_IDS)
def test_usage_that_is_not_numbers_never_fails_a_batch_through_litellm(usage):
    # LiteLLM 1.82.6 itself refuses most such replies (`litellm.Usage(**usage)` raises in its response conversion,
    # surfaced as an InternalServerError) and reads null as 0: an item is then retried and, at worst, unscorable
    # and counted; the batch always returns.
    with JudgeServer(usage=usage) as server, judge_for(server, transport="litellm", num_retries=1) as judge:
        grades = judge.grade_prefixes(GRADED)
        stats = judge.stats.snapshot()
    assert all(grade in (None, expected) for grade, expected in zip(grades, [[True, False, False], [False, True, True]]))
    assert sum(grade is None for grade in grades) == stats["failures"]


# ------------------------------------------------------------------------------------------ #16 item 5
SECRET = "jc-7f3a9b21c4d8e6f0"  # no KEY/TOKEN/SECRET in the variable's name, no `sk-` prefix


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_key_echoed_by_the_server_is_in_no_log_and_no_exception(monkeypatch, caplog, transport):
    monkeypatch.setenv("JUDGE_CRED", SECRET)
    with JudgeServer(script=("bad_request", "server_error", "unauthorized"), echo_authorization=True) as server:
        judge = judge_for(server, transport=transport, api_key_env="JUDGE_CRED", num_retries=1)
        with caplog.at_level(logging.DEBUG):
            assert judge.grade_prefixes([("P", POINTS, "alpha")]) == [None]  # 400: this item fails, with a warning
            with pytest.raises(JudgeConfigurationError) as raised:  # a 500 (retried), then a 401
                judge.grade_prefixes([("P", POINTS, "beta")])
        judge.close()
    assert server.authorization[0] == f"Bearer {SECRET}"  # the server did receive (and echo) the key
    assert "unscorable" in caplog.text and "HTTP 401" in str(raised.value)
    records = [record.getMessage() for record in caplog.records]
    assert records and not [record for record in records if SECRET in record]
    assert SECRET not in str(raised.value) and SECRET not in repr(raised.value)


def test_redact_masks_configured_keys_and_credential_headers(monkeypatch):
    monkeypatch.setenv("JUDGE_CRED", SECRET)
    LiteLLMJudge("openai/x", api_key_env="JUDGE_CRED")  # configuring a judge is what makes its key variable known
    assert redact(f"token {SECRET} leaked") == "token *** leaked"
    echoed = ('{"detail": "bad Authorization: Bearer abc.DEF-123", "headers": {"api-key": "k-987654", '
              "'x-api-key': 'zz99', \"authorization\":\"Basic dXNlcjpwYXNz\"}, \"again\": \"bearer qwerty\"}")
    masked = redact(echoed)
    for value in ("abc.DEF-123", "k-987654", "zz99", "dXNlcjpwYXNz", "qwerty"):
        assert value not in masked
    assert "Authorization: Bearer ***" in masked and '"api-key": "***"' in masked
    assert redact("HTTP 429: rate limited (retry in 2 s)") == "HTTP 429: rate limited (retry in 2 s)"


# ------------------------------------------------------------------------------------------ #16 item 8
def test_two_servers_behind_one_model_string_and_two_transports_do_not_share_answers(tmp_path):
    items = [("P", POINTS, "alpha"), ("P", POINTS, "beta")]
    with JudgeServer() as first, JudgeServer() as second:
        with judge_for(first, cache_dir=tmp_path) as judge:
            judge.grade_prefixes(items)
        with judge_for(second, cache_dir=tmp_path) as judge:
            judge.grade_prefixes(items)
        with judge_for(second, cache_dir=tmp_path, transport="openai_http") as judge:
            judge.grade_prefixes(items)
        with judge_for(second, cache_dir=tmp_path, transport="openai_http") as judge:  # the same again: cached
            judge.grade_prefixes(items)
            assert judge.stats.cache_hits == 2
    assert (first.requests, second.requests) == (2, 4)


@pytest.mark.parametrize("planted", ["another request's entry", "an entry without its request", "not JSON"])
def test_a_planted_or_mismatched_cache_file_is_ignored_and_counted(tmp_path, caplog, planted):
    alpha, beta, gamma = ("P", POINTS, "alpha zq1"), ("P", POINTS, "beta zq2"), ("P", POINTS, "gamma zq3")
    with JudgeServer() as server:
        with judge_for(server, cache_dir=tmp_path) as judge:
            judge.grade_prefixes([alpha, beta, gamma])
        paths = {}
        for body in server.bodies:  # each request's cache file, from the messages the server received
            fingerprint = request_fingerprint("openai/scripted-judge", server.api_base, "litellm", body["messages"],
                                              {"temperature": 0.0})
            marker = next(word for word in ("zq1", "zq2", "zq3") if word in body["messages"][-1]["content"])
            paths[{"zq1": "alpha", "zq2": "beta", "zq3": "gamma"}[marker]] = tmp_path / request_key(fingerprint)[:2] / f"{request_key(fingerprint)}.json"
        assert all(path.exists() for path in paths.values())
        for target in ("beta", "gamma"):  # both now hold alpha's answer: a reader trusting them grades alpha
            if planted == "another request's entry":
                shutil.copy(paths["alpha"], paths[target])
            elif planted == "an entry without its request":  # also what an entry of the previous format looks like
                entry = json.loads(paths["alpha"].read_text())
                paths[target].write_text(json.dumps({"model": entry["request"]["model"], "content": entry["content"]}))
            else:
                paths[target].write_text("{ not json")
        server.reset_counters()
        with judge_for(server, cache_dir=tmp_path) as judge, caplog.at_level(logging.WARNING):
            grades = judge.grade_prefixes([alpha, beta, gamma])
            stats = judge.stats.snapshot()
    assert grades == [[True, False, False], [False, True, False], [False, False, True]]
    assert (stats["cache_hits"], stats["cache_rejected"], stats["calls"], server.requests) == (1, 2, 2, 2)
    assert caplog.text.count("does not match its key") == 1  # warned once per cache, counted each time
    assert ResponseCache(tmp_path).get(request_key(request_fingerprint(
        "openai/scripted-judge", server.api_base, "litellm", server.bodies[0]["messages"], {"temperature": 0.0}
    )))["content"]  # and the re-asked answers replaced the planted files


def test_a_cache_written_before_the_fingerprint_is_a_miss(tmp_path):
    with JudgeServer() as server:
        with judge_for(server) as judge:
            assert judge.grade_prefixes([("P", POINTS, "alpha zq1"), ("P", POINTS, "beta zq2")]) == [
                [True, False, False], [False, True, False]]
        alpha, beta = sorted(server.bodies, key=lambda body: "zq2" in body["messages"][-1]["content"])
        # An entry as format 1 wrote it (key: model, messages, params; no stored request) holding alpha's answer.
        old = json.dumps({"format": 1, "model": "openai/scripted-judge", "messages": beta["messages"],
                          "params": {"temperature": 0.0}}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        old_key = hashlib.sha256(old.encode("utf-8")).hexdigest()
        (tmp_path / old_key[:2]).mkdir()
        (tmp_path / old_key[:2] / f"{old_key}.json").write_text(json.dumps({"model": "openai/scripted-judge",
                                                                             "content": scripted_judge(alpha)}))
        server.reset_counters()
        with judge_for(server, cache_dir=tmp_path) as judge:
            assert judge.grade_prefixes([("P", POINTS, "beta zq2")]) == [[False, True, False]]
            assert judge.stats.cache_hits == 0 and judge.stats.snapshot().get("cache_rejected", 0) == 0  # unread
    assert server.requests == 1


# ------------------------------------------------------------------------------------------ #23 item 7
def _read_only_file_system(monkeypatch, below: str):
    """Every directory creation and file creation below `below` fails as on a read-only mount (we run as root,
    so permission bits cannot simulate it)."""
    import errno

    real_makedirs, real_open = os.makedirs, os.open

    def makedirs(path, *args, **kwargs):
        if os.fspath(path).startswith(below) and not os.path.isdir(path):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_makedirs(path, *args, **kwargs)

    def open_(path, flags, *args, **kwargs):
        if os.fspath(path).startswith(below) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs)
    monkeypatch.setattr(os, "open", open_)


@pytest.mark.parametrize("case", ["missing on a read-only file system", "existing but read-only",
                                  "below a regular file"])
def test_an_unusable_cache_directory_is_one_clear_error_at_construction(tmp_path, monkeypatch, case):
    from ppm_trl.judge.cache import CacheDirectoryError

    if case == "below a regular file":  # a real failure, no simulation: NotADirectoryError
        (tmp_path / "file").write_text("x")
        directory = tmp_path / "file" / "cache"
    else:
        directory = tmp_path / "ro" / "cache"
        if case == "existing but read-only":
            directory.mkdir(parents=True)
        _read_only_file_system(monkeypatch, str(tmp_path / "ro"))
    with pytest.raises(CacheDirectoryError) as raised:
        LiteLLMJudge("openai/x", cache_dir=directory)
    message = str(raised.value)
    assert str(directory) in message and "`none`" in message and "\n" not in message
    assert ("cannot write" if case == "existing but read-only" else "cannot create") in message
    if case != "below a regular file":
        assert "Read-only file system" in message
    assert isinstance(raised.value, ValueError)  # the CLI prints a ValueError as one line, exit 2


def test_judge_cache_dir_none_disables_the_cache(tmp_path):
    from ppm_trl.ppm.ppm_config import PPMConfig

    kwargs = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=2,
                  per_device_train_batch_size=2, report_to="none")
    assert PPMConfig(**kwargs, judge_cache_dir="none").judge_kwargs(str(tmp_path))["cache_dir"] is None
    assert PPMConfig(**kwargs, judge_cache_dir="None").judge_kwargs(str(tmp_path))["cache_dir"] is None
    assert PPMConfig(**kwargs).judge_kwargs(str(tmp_path))["cache_dir"] == os.path.join(str(tmp_path), "judge_cache")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cache_write_failures_are_counted_and_their_warnings_rate_limited(tmp_path, monkeypatch, caplog, transport):
    items = [("P", POINTS, f"beta {n}") for n in range(120)]
    with JudgeServer() as server:
        judge = judge_for(server, cache_dir=tmp_path / "cache", transport=transport, max_concurrency=32)
        _read_only_file_system(monkeypatch, str(tmp_path / "cache"))  # the volume went read-only after start
        with caplog.at_level(logging.WARNING):
            grades = judge.grade_prefixes(items)
            grades += judge.grade_prefixes([("P", POINTS, f"gamma {n}") for n in range(100)])
        judge.close()
    assert grades == [[False, True, False]] * 120 + [[False, False, True]] * 100  # every answer kept
    assert judge.stats.cache_write_failures == 220 and judge.stats.failures == 0
    warnings = [r.getMessage() for r in caplog.records if "judge cache write" in r.getMessage()]
    assert len(warnings) == 12  # failures 1-10, then #100 and #200
    assert "#100" in warnings[10] and "#200" in warnings[11] and "every 100th" in warnings[9]
    assert all("Read-only file system" in w for w in warnings)


def test_the_write_failure_count_reaches_the_logged_metrics(tmp_path):
    from ppm_trl.judge.callback import JudgeStatsCallback

    class Judge:
        stats = __import__("ppm_trl.judge.stats", fromlist=["JudgeStats"]).JudgeStats()

    judge = Judge()
    callback = JudgeStatsCallback(judge)
    judge.stats.add(cache_write_failures=3)
    assert callback.metrics()["judge/cache_write_failures"] == 3.0


def test_train_with_an_unusable_cache_directory_is_one_line_before_training(tmp_path, capsys):
    import yaml

    from ppm_trl import cli

    (tmp_path / "file").write_text("x")
    config = {"method": "ppm", "env_name": "multi_add", "env_n": 2, "env_size": 8, "model_name_or_path": "tiny",
              "progress_scorer": "judge", "judge_model": "openai/x", "judge_api_base": "http://127.0.0.1:9/v1",
              "judge_cache_dir": str(tmp_path / "file" / "cache"), "output_dir": str(tmp_path / "out"),
              "use_cpu": True, "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8,
              "max_steps": 1, "report_to": "none"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--config", str(tmp_path / "config.yaml")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and err.count("error:") == 1
    assert f"judge cache directory '{tmp_path / 'file' / 'cache'}': cannot create it" in err
    assert not (tmp_path / "out" / "checkpoint-1").exists()
