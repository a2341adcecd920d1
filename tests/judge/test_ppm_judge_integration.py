"""PPMGRPOTrainer with the LiteLLM judge over a real loopback HTTP server: progress from graded prefixes, no request
for an empty or unchanged prefix, a second identical run served from the cache, judge metrics logged; a judge that
cannot judge stops the run (at construction, or at the first step whose requests are all unscorable)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
from datasets import Dataset
from helpers import build_trainer, capture_outputs, script_generation
from judge_server import JudgeServer

from ppm_trl.judge import JudgeConfigurationError
from ppm_trl.judge.callback import JudgeUnscorableError
from ppm_trl.judge.client import PROBE_MAX_TOKENS

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
G, K = 4, 4


def _dataset():
    # The scripted judge grades a point YES when the rollout contains the point's quoted evidence.
    points = ['computes "alpha"', 'computes "beta"', 'states the final answer "\\boxed{7}"']
    return Dataset.from_list([{
        "prompt": [{"role": "user", "content": "Compute alpha, then beta, then the answer."}],
        "answer": "7", "reference": "alpha\nbeta\n\\boxed{7}", "reasoning_points": points,
        "reasoning_graph": [{"if_all": [3], "makes_obsolete": [1, 2]}],
    }])


def _completions():
    chunk = 16  # budget 64, K = 4
    return [
        "alpha".ljust(chunk) + "beta".ljust(chunk) + "\\boxed{7}",  # m = [1/3, 2/3, 1, -]
        "x" * chunk + "alpha".ljust(chunk) + "y" * 10,  # m = [0, 1/3, 1/3, -]
        "z" * 5,  # m = [0, -, -, -]
        "beta".ljust(chunk),  # m = [1/3]: only point 2
    ]


def _outcome(completions, **kwargs):
    return [1.0 if "\\boxed{7}" in c[0]["content"] else 0.0 for c in completions]


def _train(tmp_path, server, api_base=None, **settings):
    trainer = build_trainer(
        "ppm", tmp_path / "out", reward_funcs=_outcome, train_dataset=_dataset(), per_device_train_batch_size=4,
        num_generations=G, max_completion_length=64, num_segments=K, max_steps=1, filter_zero_advantage_groups=False,
        progress_scorer="judge", judge_model="openai/loopback-judge", judge_api_base=api_base or server.api_base,
        judge_cache_dir=str(tmp_path / "cache"), judge_timeout=10, **settings)
    texts = _completions()
    script_generation(trainer, lambda prompt, index: texts[index % G])
    outputs = capture_outputs(trainer)
    trainer.train()
    return trainer, outputs[0]["advantages"]


def test_ppm_with_loopback_judge(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    with JudgeServer() as server:
        trainer, adv = _train(tmp_path, server)
        # One request per non-empty prefix that differs from the previous one: row0 3, row1 3, row2 1, row3 1.
        # Empty segments (rows 2 and 3 end in segment 1) send nothing. Plus the probe at construction.
        assert server.requests == 9 and server.bodies[0]["max_tokens"] == PROBE_MAX_TOKENS
        first_run_requests = server.requests - 1
        # Rewards (outcome on valid segments): row0 [1/3+1, 1/3+1, 1/3+1, 0]; row1 [0, 1/3, 0, 0];
        # row2 [0, 0, 0, 0]; row3 [1/3, 0, 0, 0]. Segment-1 mean (4/3 + 0 + 0 + 1/3)/4 = 5/12.
        assert torch.allclose(adv[0, :16], torch.full((16,), 4 / 3 - 5 / 12), atol=1e-5)
        assert torch.allclose(adv[3, :5], torch.full((5,), 1 / 3 - 5 / 12), atol=1e-5)
        # Segment 2 of row 1 (alpha reached there): 1/3 - mean(4/3, 1/3, 0, 0) = 1/3 - 5/12.
        assert torch.allclose(adv[1, 16:32], torch.full((16,), 1 / 3 - 5 / 12), atol=1e-5)
        logged = trainer.state.log_history[0]
        assert logged["ppm/scorer_requests"] == 8 and logged["ppm/scorer_failures"] == 0
        assert any(key.startswith("judge/") for key in logged)

        server.reset_counters()
        _train(tmp_path, server, judge_probe=False)  # same prefixes: every grade from the on-disk cache, no probe
        assert server.requests == 0 and first_run_requests == 8


def test_unreachable_judge_fails_at_construction(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: connection refused
    with pytest.raises(JudgeConfigurationError, match=rf"judge model 'openai/loopback-judge' at "
                                                      rf"api_base=http://127.0.0.1:{port}/v1 cannot be used: the judge "
                                                      r"is not reachable .*key variable OPENAI_API_KEY is set"):
        _train(tmp_path, None, api_base=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ValueError, match=r"judge_max_unscorable_frac must be in \(0, 1\], got 1.5"):
        _train(tmp_path, None, api_base="http://127.0.0.1:1/v1", judge_max_unscorable_frac=1.5)


def test_a_step_with_every_judge_request_unscorable_stops_training(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    # The probe answers; then every grading request is a 400 (e.g. prompts longer than the judge's context).
    with JudgeServer(script=(None,), fault_rate=1.0, fault_kinds=("bad_request",)) as server:
        with pytest.raises(JudgeUnscorableError, match=r"8 of 8 judge requests were unscorable over the last 1 "
                                                       r"step\(s\).*model 'openai/loopback-judge'.*HTTP 400"):
            _train(tmp_path, server, judge_num_retries=0, judge_unscorable_min_rows=1)  # its one row suffices
        assert server.requests == 9


def test_the_numbers_a_run_prints_are_the_judge_requests_it_made(tmp_path, monkeypatch):
    """Issue 44 item 2: the done line averaged TRL's end-of-training entry (judge/calls 0) into every judge metric,
    and train().metrics said judge/calls 0. Counted at the server: per-step means over the steps, totals in both."""
    from ppm_trl.report import training_summary

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    with JudgeServer() as server:
        trainer = build_trainer(
            "ppm", tmp_path / "out", reward_funcs=_outcome, train_dataset=_dataset(), per_device_train_batch_size=4,
            num_generations=G, max_completion_length=64, num_segments=K, max_steps=3,
            filter_zero_advantage_groups=False, progress_scorer="judge", judge_model="openai/loopback-judge",
            judge_api_base=server.api_base, judge_cache_dir="none", judge_timeout=10, judge_probe=False,
            logging_steps=1)
        texts = _completions()
        script_generation(trainer, lambda prompt, index: texts[index % G])
        result = trainer.train()
        counted = server.requests
    steps = [entry for entry in trainer.state.log_history if "train_runtime" not in entry]
    per_step = [entry["judge/calls"] for entry in steps]
    assert len(per_step) == 3 and sum(per_step) == counted > 0
    summary = training_summary(trainer, result, "ppm")
    assert summary["metrics_mean"]["judge/calls"] == pytest.approx(counted / 3)
    assert summary["judge_totals"]["calls"] == counted
    assert result.metrics["judge/calls"] == counted  # train().metrics: the run's totals
