"""A judge that cannot judge says so at once: the probe, auth errors without retries, a local server without a key,
real failure reasons (`explain=True`), and the training-time abort on unscorable steps."""

from __future__ import annotations

import logging
import os
import socket
from types import SimpleNamespace

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer  # noqa: E402

from ppm_trl.judge import JudgeConfigurationError, LiteLLMJudge  # noqa: E402
from ppm_trl.judge.client import PROBE_MAX_TOKENS  # noqa: E402
from ppm_trl.judge.tasks import REQUEST_ERROR, UNREADABLE, JudgeFailure  # noqa: E402

POINTS = ['The solution contains "alpha".', 'The solution contains "beta".']
FAST = dict(timeout=5.0, backoff_base=0.005, backoff_max=0.02)
TRANSPORTS = ["litellm", "openai_http"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


def make_judge(api_base, transport, tmp_path=None, **kwargs) -> LiteLLMJudge:
    options = dict(FAST, cache_dir=None if tmp_path is None else tmp_path / "cache", transport=transport) | kwargs
    return LiteLLMJudge(options.pop("model", "openai/scripted-judge"), api_base=api_base, **options)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_probe_is_tiny_uncached_and_uncounted(tmp_path, monkeypatch, transport):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer() as server, make_judge(server.api_base, transport, tmp_path) as judge:
        assert judge.probe() is None
        assert server.requests == 1 and server.bodies[0]["max_tokens"] == PROBE_MAX_TOKENS
        assert judge.stats.snapshot()["calls"] == 0 and judge.stats.snapshot()["attempts"] == 0
        assert not list((tmp_path / "cache").rglob("*.json"))  # never cached


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_probe_names_model_api_base_and_key_variable(monkeypatch, transport):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-0123")
    with JudgeServer(require_key="sk-right-key-4567") as server, make_judge(server.api_base, transport) as judge:
        with pytest.raises(JudgeConfigurationError) as raised:
            judge.probe()
        assert server.requests == 1
    message = str(raised.value)
    assert "'openai/scripted-judge'" in message and server.api_base in message
    assert "HTTP 401" in message and "key variable OPENAI_API_KEY is set" in message
    assert "sk-wrong-key-0123" not in message

    with JudgeServer(served_models=("served-model",)) as server, make_judge(server.api_base, transport) as judge:
        with pytest.raises(JudgeConfigurationError, match=r"model name or api_base is wrong \(not found\) \(HTTP 404\)"):
            judge.probe()

    unreachable = f"http://127.0.0.1:{closed_port()}/v1"
    with make_judge(unreachable, transport) as judge:
        with pytest.raises(JudgeConfigurationError, match=rf"at api_base={unreachable} cannot be used: the judge is not "
                                                          "reachable"):
            judge.probe()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_probe_only_warns_on_transient_or_per_item_errors(monkeypatch, caplog, transport):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    for fault in ("server_error", "rate_limit", "context_length"):
        with JudgeServer(script=(fault,)) as server, make_judge(server.api_base, transport) as judge, \
                caplog.at_level(logging.WARNING):
            problem = judge.probe()
            assert problem is not None and server.requests == 1  # one request, no retries
    assert "judge probe of 'openai/scripted-judge'" in caplog.text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_local_server_needs_no_key(monkeypatch, transport):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("HOSTED_VLLM_API_KEY", raising=False)
    for model in ("openai/scripted-judge", "hosted_vllm/scripted-judge"):
        with JudgeServer() as server, make_judge(server.api_base, transport, model=model, num_retries=0) as judge:
            assert judge.probe() is None
            assert judge.grade_prefixes([("P", POINTS, "alpha")]) == [[True, False]]
            assert judge.stats.failures == 0


def test_probe_refuses_a_missing_gemini_key_naming_the_variable(monkeypatch):
    """Issue 33 item 3: LiteLLM raises "Missing Gemini API key" as a connection error (with a traceback in its
    message); the probe used to warn "training continues" and every row was retried 5 times."""
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with LiteLLMJudge("gemini/gemini-2.5-flash-lite", cache_dir=None, num_retries=3, **FAST) as judge:
        with pytest.raises(JudgeConfigurationError) as raised:
            judge.probe()
        assert judge.stats.attempts == 0  # the probe is uncounted; nothing else was sent
    message = str(raised.value)
    assert "the API key was refused or is missing (HTTP 401); key variable GEMINI_API_KEY is NOT set" in message
    assert "Traceback" not in message and "\n" not in message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_probe_refuses_a_key_the_provider_rejects_with_http_400(monkeypatch, transport):
    """Gemini answers a wrong key with 400 "API key not valid": refused by the probe, and fatal (no per-row
    failures, no retries) for a judge built without a probe."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-0123")
    with JudgeServer(fault_rate=1.0, fault_kinds=("key_not_valid",)) as server, \
            make_judge(server.api_base, transport, num_retries=3) as judge:
        with pytest.raises(JudgeConfigurationError, match=r"refused or is missing \(HTTP 401\); key variable "
                                                          r"OPENAI_API_KEY is set"):
            judge.probe()
        with pytest.raises(JudgeConfigurationError):
            judge.grade_prefixes([("P", POINTS, "alpha"), ("Q", POINTS, "beta")])
        assert server.requests <= 3 and judge.stats.retries == 0 and judge.stats.failures == 0


def test_missing_key_is_a_configuration_error_without_retries(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # No api_base: the real provider; LiteLLM refuses to send without a key ("Missing credentials", as a 500).
    with LiteLLMJudge("openai/gpt-4o-mini", num_retries=3, **FAST) as judge:
        with pytest.raises(JudgeConfigurationError, match=r"refused or is missing \(HTTP 401\); key variable "
                                                          r"OPENAI_API_KEY is NOT set"):
            judge.grade_prefixes([("P", POINTS, "alpha")])
        assert judge.stats.retries == 0 and judge.stats.attempts == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_explain_gives_the_real_failure_reason(monkeypatch, transport):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer(script=("context_length", "garbage")) as server, \
            make_judge(server.api_base, transport, num_retries=0) as judge:
        too_long = judge.run(lambda: judge.agenerate_points("P", "R \\boxed{1}", "1", explain=True))
        unreadable = judge.run(lambda: judge.agenerate_points("Q", "S \\boxed{1}", "1", explain=True))
        assert judge.generate_points("Q", "S \\boxed{1}", "1") == ["The solution concludes that the answer is \\boxed{1}."]
    assert isinstance(too_long, JudgeFailure) and too_long.kind == REQUEST_ERROR and not too_long
    assert "HTTP 400" in too_long.reason and "maximum context length is 1024 tokens" in too_long.reason
    assert isinstance(unreadable, JudgeFailure) and unreadable.kind == UNREADABLE
    assert "unreadable answer '%%% lorem ipsum" in unreadable.reason
    # The public task API still says None for an unscorable item.
    with JudgeServer(script=("context_length",)) as server, make_judge(server.api_base, transport, num_retries=0) as judge:
        assert judge.generate_points("P", "R \\boxed{1}", "1") is None


def test_unscorable_steps_stop_training(monkeypatch):
    from ppm_trl.judge.callback import JudgeStatsCallback, JudgeUnscorableError

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer() as server, make_judge(server.api_base, "openai_http", num_retries=0) as judge:
        args = SimpleNamespace(judge_probe=False, judge_max_unscorable_frac=0.5, judge_unscorable_window=2)
        trainer = SimpleNamespace(args=args, callback_handler=SimpleNamespace(callbacks=[]))
        callback = JudgeStatsCallback(judge).install(trainer)
        assert server.requests == 0  # judge_probe=False: no probe
        judge.grade_prefixes([("P", POINTS, "alpha"), ("P", POINTS, "beta")])
        callback.on_step_end(None, None, None)  # 0/2 unscorable
        callback.on_step_end(None, None, None)  # a step without judge requests does not count
        server.script = [None] * server.requests + ["bad_request"]
        judge.grade_prefixes([("P", POINTS, "gamma"), ("P", POINTS, "delta")])
        callback.on_step_end(None, None, None)  # window 1/4 unscorable: below 0.5
        server.script = [None] * server.requests + ["bad_request"] * 2
        judge.grade_prefixes([("P", POINTS, "alpha beta"), ("P", POINTS, "beta alpha")])
        with pytest.raises(JudgeUnscorableError, match=r"3 of 4 judge requests were unscorable over the last 2 "
                                                       r"step\(s\).*Last failure: judge request failed .*HTTP 400"):
            callback.on_step_end(None, None, None)  # window: steps 3 and 4, 3/4 unscorable
    with pytest.raises(ValueError, match=r"judge_max_unscorable_frac must be in \(0, 1\], got 0"):
        JudgeStatsCallback(judge, max_unscorable_frac=0)
    with pytest.raises(ValueError, match="judge_unscorable_window must be an integer >= 1, got 0"):
        JudgeStatsCallback(judge, unscorable_window=0)


def test_install_probes_once_even_when_passed_in_callbacks(monkeypatch):
    from ppm_trl.judge.callback import JudgeStatsCallback

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer() as server, make_judge(server.api_base, "openai_http") as judge:
        callback = JudgeStatsCallback(judge)
        trainer = SimpleNamespace(args=SimpleNamespace(), callback_handler=SimpleNamespace(callbacks=["reporting", callback]))
        callback.install(trainer)
        callback.install(trainer)
        assert trainer.callback_handler.callbacks == [callback, "reporting"]
        assert server.requests == 1 and server.bodies[0]["max_tokens"] == PROBE_MAX_TOKENS


def _unscorable_on_two_processes(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    from ppm_trl.judge import JudgeStats
    from ppm_trl.judge.callback import JudgeStatsCallback, JudgeUnscorableError

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        judge = SimpleNamespace(stats=JudgeStats(), model="openai/x", api_base=None, last_failure=None)
        outcomes = []
        for limit in (1.0, 0.5):
            callback = JudgeStatsCallback(judge, max_unscorable_frac=limit)
            judge.stats.add(calls=2, failures=2 if rank == 0 else 0)  # rank 0: all unscorable; rank 1: none
            try:
                callback.check_unscorable()
                outcomes.append("continued")
            except JudgeUnscorableError as error:
                outcomes.append(str(error).split(" over")[0])
        results[rank] = outcomes
    finally:
        dist.destroy_process_group()


def test_processes_decide_together():
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    # fork: no re-import of torch and the test module in the children (seconds, not half a minute)
    mp.start_processes(_unscorable_on_two_processes, args=(closed_port(), results), nprocs=2, join=True,
                       start_method="fork")
    # 2 of the 4 requests of the step (over both processes) failed: below 1.0, at 0.5; both processes agree.
    assert results[0] == results[1] == ["continued", "2 of 4 judge requests were unscorable"]
