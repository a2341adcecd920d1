"""Every benchmark script runs in its quick mode, so none of them rots (no timing is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_overhead_quick(tmp_path):
    out = tmp_path / "overhead.json"
    stdout = _run("benchmarks/overhead.py", "--quick", "--json", str(out))
    results = json.loads(out.read_text())
    assert {"ppm_math_fraction_of_step", "papo_math_fraction_of_grpo_step", "arg_extra_vs_plain_generation"} <= set(
        results)
    assert "PPM step / GRPO step" in stdout


def test_judge_throughput_quick():
    stdout = _run("benchmarks/judge_throughput.py", "--requests", "64", "--latency", "0.01", "--transport", "both")
    assert stdout.count("0 requests reached the server") == 2  # the cached rerun of each transport


@pytest.mark.parametrize("script, flags", [("snr.py", []), ("horizon_scaling.py", ["--env", "multi_add"]),
                                           ("horizon_scaling.py", ["--env", "chain_add", "--best-lrs", "sparse=1e-4",
                                                                   "--only", "cliff"])])
def test_learning_benchmarks_quick(tmp_path, script, flags):
    extra = ["--cache-dir", str(tmp_path / "cache")] if script == "horizon_scaling.py" else []
    out = tmp_path / "results"
    _run(f"benchmarks/{script}", "--quick", "--output-dir", str(out), *flags, *extra)
    written = [p for p in tmp_path.rglob("*") if p.suffix in (".json", ".png") and "cache" not in p.parts]
    assert {p.suffix for p in written} == {".json", ".png"}  # horizon_scaling appends `_quick` to the directory


def test_warmstart_profile_quick(tmp_path):
    stdout = _run("benchmarks/warmstart_profile.py", "--quick", "--env", "chain_add", "--cache-dir", str(tmp_path))
    results = json.loads(stdout.strip().splitlines()[-1])["results"]
    assert [r["n"] for r in results] == [1, 2] and [len(r["lines"]) for r in results] == [1, 2]
    assert all(0 <= r["all_correct"] <= min(r["lines"]) <= 1 for r in results)  # all-correct needs every line
    assert "| all-correct |" in stdout and "n = 2, line by line:" in stdout
