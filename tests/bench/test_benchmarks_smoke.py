"""Every benchmark script runs in its quick mode, so none of them rots (no timing is asserted)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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


def test_judge_quota_one_process_quick(tmp_path):
    """One accelerate launch per mode against the quota server: the table's shape, and the limiter's bound."""
    out = tmp_path / "judge_quota.json"
    stdout = _run("benchmarks/judge_quota.py", "--processes", "1", "--steps", "1", "--overhead-repeats", "0",
                  "--json", str(out))
    rows = json.loads(out.read_text())["quota"]
    assert [(row["processes"], row["limiter"]) for row in rows] == [(1, False), (1, True)]
    limited = rows[1]
    assert limited["requests_seen"] > 0 and limited["unscorable"] == 0
    assert limited["max_in_window"] <= limited["bound_per_window"]
    assert "| processes | limiter | requests |" in stdout


def test_judge_overlap_quick(tmp_path):
    out = tmp_path / "judge_overlap.json"
    stdout = _run("benchmarks/judge_overlap.py", "--quick", "--json", str(out))
    results = json.loads(out.read_text())
    summary = results["summary"]
    assert [row["latency_s"] for row in summary] == results["settings"]["latencies"]
    assert all(row["judge_s"] > 0 and row["logprob_s"] > 0 and 0 <= row["fraction_hidden"] <= 1 for row in summary)
    assert {(step["latency"], step["overlap"]) for step in results["steps"]} == {
        (latency, overlap) for latency in results["settings"]["latencies"] for overlap in (True, False)}
    assert all(step["requests"] > 0 for step in results["steps"])  # no step was served from the cache
    assert "| L (s) | step sequential (s) | step overlapped (s) | judge (s) | log-prob (s) |" in stdout


def test_judge_throughput_quick():
    stdout = _run("benchmarks/judge_throughput.py", "--requests", "64", "--latency", "0.01", "--transport", "both",
                  "--bare")
    assert stdout.count("0 requests reached the server") == 2  # the cached rerun of each transport
    assert "[bare openai_http transport] 64 requests" in stdout


@pytest.mark.parametrize("script, flags", [("snr.py", []), ("horizon_scaling.py", ["--env", "multi_add"]),
                                           ("horizon_scaling.py", ["--env", "chain_add", "--best-lrs", "sparse=1e-4",
                                                                   "--only", "cliff"])])
def test_learning_benchmarks_quick(tmp_path, script, flags):
    extra = ["--cache-dir", str(tmp_path / "cache")] if script == "horizon_scaling.py" else []
    out = tmp_path / "results"
    _run(f"benchmarks/{script}", "--quick", "--output-dir", str(out), *flags, *extra)
    written = [p for p in tmp_path.rglob("*") if p.suffix in (".json", ".png") and "cache" not in p.parts]
    assert {p.suffix for p in written} == {".json", ".png"}  # horizon_scaling appends `_quick` to the directory


def test_horizon_scaling_composed_variants_quick(tmp_path):
    """PPM+ARG and PAPO+ARG run through the benchmark, tuned at the impossible horizon, with their training logs."""
    out = tmp_path / "results"
    stdout = _run("benchmarks/horizon_scaling.py", "--quick", "--output-dir", str(out), "--env", "multi_add",
                  "--variants", "ppm+arg", "papo+arg", "--tune-at", "impossible", "--only", "impossible",
                  "--cache-dir", str(tmp_path / "cache"))
    assert "best learning rates at the impossible" in stdout
    runs = tmp_path / "results_quick" / "runs"
    for variant in ("ppm+arg", "papo+arg"):
        logs = json.loads((runs / f"{variant}_n3_lr0.0001_s0.json").read_text())["train_logs"]
        per_step = [log for log in logs if "arg/inserted_rows" in log]
        assert len(per_step) == 2  # --quick: 2 steps, logged every step
        assert all(log["arg/all_failure_groups"] >= 0 for log in per_step)
        assert ("ppm/frac_rows_filtered" in per_step[0]) == (variant == "ppm+arg")
    rows = [line for line in stdout.splitlines()  # the main table's rows (the per-line table has 4 columns)
            if line.startswith("| 3 (impossible)") and len(line.split(" | ")) == 9]
    assert [row.split(" | ")[2] for row in rows] == ["PPM segment-level + ARG", "PAPO + ARG"]
    assert rows[0].split(" | ")[-2] != "–" and rows[1].split(" | ")[-2] == "–"  # frac_rows_filtered: PPM only


def test_warmstart_profile_quick(tmp_path):
    stdout = _run("benchmarks/warmstart_profile.py", "--quick", "--env", "chain_add", "--cache-dir", str(tmp_path))
    results = json.loads(stdout.strip().splitlines()[-1])["results"]
    assert [r["n"] for r in results] == [1, 2] and [len(r["lines"]) for r in results] == [1, 2]
    assert all(0 <= r["all_correct"] <= min(r["lines"]) <= 1 for r in results)  # all-correct needs every line
    assert "| all-correct |" in stdout and "n = 2, line by line:" in stdout


def _horizon_scaling_module():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import horizon_scaling
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return horizon_scaling


def test_horizon_scaling_refuses_cached_runs_made_with_other_settings(tmp_path):
    """A run cached with --steps 80 must not be reused silently by an invocation asking for --steps 40."""
    hs = _horizon_scaling_module()
    args = hs.parse_args(["--output-dir", str(tmp_path), "--steps", "40", "--eval-every", "20"])
    cached = {"spec": {"variant": "sparse", "n": 6, "learning_rate": 1e-4, "max_steps": 80, "prompts_per_step": 8,
                       "num_generations": 8, "num_segments": None, "eval_every": 20, "seed": 0}, "history": []}
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "sparse_n6_lr0.0001_s0.json").write_text(json.dumps(cached))
    with pytest.raises(ValueError, match=r"max_steps.*\(80, 40\)"):
        hs.run(args, "unused", "sparse", 6, 1e-4, 0, eval_sets={})
    args = hs.parse_args(["--output-dir", str(tmp_path), "--steps", "80", "--eval-every", "20"])
    assert hs.run(args, "unused", "sparse", 6, 1e-4, 0, eval_sets={}) == cached  # same settings: reused


def test_horizon_scaling_output_dir_belongs_to_one_warm_start(tmp_path):
    hs = _horizon_scaling_module()
    hs.check_warm_start(str(tmp_path / "out"), "/cache/warmstart/aaaa")
    hs.check_warm_start(str(tmp_path / "out"), "/cache/warmstart/aaaa/")  # same one: fine
    with pytest.raises(ValueError, match="made from warm start aaaa, this invocation uses bbbb"):
        hs.check_warm_start(str(tmp_path / "out"), "/cache/warmstart/bbbb")


# 79 s alone on the 2-core machine (2026-12-07, `pytest --durations`; 151 s before the runs shared one worker pool):
# the run's own bound (1,800 s) catches a hang first, at ≥ 10× that; the test's stays above it.
@pytest.mark.timeout(3600)
def test_evidence_quick_writes_the_summary_with_the_issue_shape(tmp_path):
    out = tmp_path / "evidence"
    stdout = _run("benchmarks/evidence.py", "--quick", "--workers", "2", "--output-dir", str(out), "--cache-dir",
                  str(tmp_path / "cache"), timeout=1800)
    quick = Path(str(out) + "_quick")
    summary = json.loads((quick / "summary.json").read_text())
    assert isinstance(summary["warm_start_fingerprint"], str) and len(summary["warm_start_fingerprint"]) == 16
    ppm = summary["ppm"]
    assert ppm["horizons"] == [1, 2] and ppm["hardest_n"] == 2 and ppm["reporting_seeds"] == [0, 1]
    assert set(ppm["gap_by_n"]) == set(ppm["gap_by_n_greedy"]) == {"1", "2"}
    assert set(ppm["lr_grid"]) == {"sparse", "trajectory", "lines_answer", "lines", "segment", "verifree", "opsd"}
    assert all(grid == [1e-3] for grid in ppm["lr_grid"].values())
    assert isinstance(ppm["best_lr_at_edge"], bool) and isinstance(ppm["censored"], bool)
    assert "ratio_median" in ppm and "ratio_ci95" in ppm
    # Issue 40's keys: a grid and a best lr at every horizon, every arm at the shared lr too, censoring kept.
    assert set(ppm["best_lr_by_n"]) == set(ppm["shared_lr_by_n"]) == set(ppm["matched_lr"]) == {"1", "2"}
    assert set(ppm["best_lr_by_n"]["1"]) == {"sparse", "trajectory", "lines_answer"}
    assert set(ppm["matched_lr"]["2"]) == {"sparse", "trajectory", "lines_answer", "lines", "segment", "verifree", "opsd"}
    assert all(len(ppm["ratio_by_seed"][n]) == 2 for n in ("1", "2"))  # one entry per reporting seed, censored or not
    assert set(ppm["km_median"]["2"]) == {"sparse", "trajectory", "lines_answer", "lines", "segment", "verifree", "opsd"}
    assert all(len(interval) == 2 for interval in ppm["matched_gap_ci95_by_n"].values())
    # Tuning and reporting never share a seed, and tuning runs are evaluated on the tuning prompts.
    runs = [json.loads(p.read_text()) for p in (quick / "runs" / "multi_add").glob("*.json")]
    assert {r["eval_role"] for r in runs if r["spec"]["seed"] == 100} == {"tune"}
    assert {r["eval_role"] for r in runs if r["spec"]["seed"] in (0, 1)} == {"report"}
    assert all("greedy_all_correct" in r["history"][-1] for r in runs)
    assert all(r["history"][0]["kl_to_start"] == 0.0 for r in runs)  # KL to the warm start, 0 before any step
    robust = summary["ppm_robust"]
    assert robust["task"] == "chain_add" and set(robust["best_lr_by_n"]["2"]) == {"sparse", "lines_answer"}
    assert set(robust["gap_paired_by_n"]) == {"1", "2"} and len(robust["ratio_by_seed"]["2"]) == 2
    papo = summary["papo"]
    assert papo["task"] == "multi_add_boxed"
    arms = {"grpo", "papo", "papo_fullnorm", "papo_mult", "prm_only"}
    assert set(papo["zero_adv_frac"]) == set(papo["final_accuracy"]) == arms
    assert isinstance(papo["prm_only_accuracy_drop"], float)
    # One process score per comparison: every arm again with the gameable score; harder held-out problems.
    assert set(papo["gameable"]) == arms and set(papo["gameable"]["papo"]) == {
        "final_accuracy", "line_accuracy", "prm_reward_delta"}
    assert set(papo["harder_eval"]) == arms and len(papo["harder_eval_paired_gap"]) == 3
    papo_runs = [json.loads(p.read_text()) for p in (quick / "runs" / "multi_add_boxed").glob("*.json")]
    reported = [r for r in papo_runs if r["spec"]["seed"] in (0, 1)]
    assert {r["spec"]["variant"] for r in reported} >= {"papo_gameable", "prm_only_lines", "prm_only"}
    assert all(set(r["history"][-1]["harder"]) == {"3", "4"} and "shown_work" in r["history"][0] for r in reported)
    arg = summary["arg"]
    assert arg["task"] == "multi_add_any_order"
    assert set(arg["rescue_rate"]) == {"arg", "resampling", "resampling_fallback", "fixed_half", "fixed_quarter",
                                       "reference_insertion"}
    assert set(arg["pass_at_8"]) == set(arg["rescue_rate"]) | {"grpo"}
    assert set(arg["paper_resampling"]) == {"rescue_rate", "pass_at_8"} and set(arg["hard_regime"]) == {
        "arg", "resampling", "grpo"}
    assert len(arg["vs_grpo_paired"]) == 3 and set(arg["grpo_all_failure_share"]) == {"main", "hard"}
    assert len(arg["lr"]) == 7  # every arm tuned
    arg_runs = [json.loads(p.read_text()) for p in (quick / "runs" / "multi_add_any_order").glob("*.json")]
    assert all("pass@8" in r["history"][-1] for r in arg_runs if r["spec"]["seed"] in (0, 1))
    assert "### PPM by horizon" in stdout and "rescue rate" in stdout
    # A second invocation trains nothing: every run is cached.
    again = _run("benchmarks/evidence.py", "--quick", "--output-dir", str(out), "--cache-dir", str(tmp_path / "cache"))
    assert "to train" not in again
    # --summarize-only reads the runs of the warm starts they were measured on and builds none (an empty cache stays
    # empty), so runs measured under other kernels stay auditable; the tables come out the same.
    tables = (quick / "tables.md").read_text()
    empty = tmp_path / "empty_cache"
    empty.mkdir()
    _run("benchmarks/evidence.py", "--quick", "--summarize-only", "--output-dir", str(out), "--cache-dir", str(empty))
    assert list(empty.iterdir()) == [] and (quick / "tables.md").read_text() == tables


def test_evidence_statistics_by_hand():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import evidence
    import evidence_protocol
    import evidence_stats

    mean, interval = evidence_stats.t_interval([1.0, 2.0, 3.0])  # s = 1, t(2) = 4.303: 2 ± 4.303/sqrt(3)
    assert mean == 2.0 and interval == pytest.approx([2 - 4.303 / 3 ** 0.5, 2 + 4.303 / 3 ** 0.5])
    assert evidence_stats.t_interval([0.5]) == (0.5, None)
    with pytest.raises(SystemExit):  # tuning and reporting seeds must be disjoint
        evidence.parse_args(["--tuning-seeds", "0", "1", "--seeds", "1", "2", "3"])
    with pytest.raises(SystemExit):  # a grid of fewer than three values cannot bracket an optimum
        evidence.parse_args(["--lrs", "1e-4", "3e-4"])
    tuning = evidence_protocol.eval_set("multi_add", 2, "tune", 64)
    held_out = evidence_protocol.eval_set("multi_add", 2, "report", 64)
    assert len(tuning) == 64 and not {json.dumps(r["prompt"]) for r in tuning} & {json.dumps(r["prompt"]) for r in held_out}


def test_evidence_tuning_extends_a_grid_whose_best_sits_at_an_edge():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import evidence
    import evidence_protocol

    # Scripted final all-correct by lr: "sparse" peaks at 1e-5 (below the grid: two extensions down, still at the
    # edge after the second, which the report must say); "lines" peaks inside the grid (no extension).
    peak = {"sparse": 1e-5, "lines": 2e-4}

    class FakeRunner:
        calls = []

        def run(self, specs):
            self.calls.append(sorted({(s.variant, s.learning_rate) for s in specs}))
            return {(s.variant, s.n, s.learning_rate, s.seed): {"history": [{
                "all_correct": 1 - abs(math.log10(s.learning_rate / peak[s.variant])), "per_subproblem": 0.5}]}
                for s in specs}

    args = evidence.parse_args(["--lrs", "1e-4", "3e-4", "1e-3", "--max-extensions", "2"])
    runner = FakeRunner()
    tuned = evidence_protocol.tune(args, runner, ["sparse", "lines"], 4, 10)
    assert sorted(tuned["sparse"]["grid"]) == [pytest.approx(v) for v in (1.11e-5, 3.33e-5, 1e-4, 3e-4, 1e-3)]
    assert tuned["sparse"]["best"] == pytest.approx(1.11e-5) and tuned["sparse"]["at_edge"] is True
    assert sorted(tuned["lines"]["grid"]) == [1e-4, 3e-4, 1e-3] and tuned["lines"]["best"] == 3e-4
    assert tuned["lines"]["at_edge"] is False
    assert len(runner.calls) == 3 and {v for v, _ in runner.calls[1]} == {"sparse"}  # only the open grid goes on


def test_evidence_prm_only_is_tuned_for_its_own_reward_not_for_accuracy():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import evidence
    import evidence_protocol

    # Higher lr: more of the gameable reward, less accuracy (the hacking). Ranked by its own reward, 3e-4 wins
    # (and the grid is extended upwards); ranked by accuracy, the lowest lr would.
    def result(lr):
        reward = {1e-4: 0.70, 3e-4: 0.80, 1e-3: 0.90, 3e-3: 0.85}.get(lr, 0.6)
        return {"history": [{"all_correct": 0.9 - 300 * lr, "per_subproblem": 0.5}],
                "train_logs": [{"step": 10, "rewards/shown_work_reward/mean": reward}]}

    class FakeRunner:
        def run(self, specs):
            return {(s.variant, s.n, s.learning_rate, s.seed): result(s.learning_rate) for s in specs}

    args = evidence.parse_args(["--lrs", "1e-4", "3e-4", "1e-3", "--max-extensions", "1"])
    own = evidence_protocol.tune(args, FakeRunner(), ["prm_only"], 3, 10,
                                 scores={"prm_only": evidence_protocol.own_reward_score})
    assert own["prm_only"]["best"] == 1e-3 and sorted(own["prm_only"]["grid"]) == [1e-4, 3e-4, 1e-3, 3e-3]
    by_accuracy = evidence_protocol.tune(args, FakeRunner(), ["prm_only"], 3, 10)
    assert by_accuracy["prm_only"]["best"] == pytest.approx(3.33e-5)  # extended below 1e-4, its edge


def test_evidence_one_part_keeps_the_other_parts_tables(tmp_path, monkeypatch):
    """`--parts X` rewrites X's tables in tables.md and keeps the others from the earlier summary.json."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import evidence

    def part(name, text):
        def run(args, summary, tables):
            tables.append(f"### {name} {text}")
        return run

    for name in ("ppm", "ppm_robust", "papo", "arg"):
        monkeypatch.setattr(evidence, f"{name}_part", part(name, "first"))
    evidence.main(["--output-dir", str(tmp_path)])
    monkeypatch.setattr(evidence, "papo_part", part("papo", "second"))
    evidence.main(["--parts", "papo", "--output-dir", str(tmp_path)])
    assert (tmp_path / "tables.md").read_text().split("\n\n") == [
        "### ppm first", "### ppm_robust first", "### papo second", "### arg first\n"]


def test_kernel_pinning_quick(tmp_path, monkeypatch):
    """Native builds at the lowest and highest ATen level this CPU has, as chosen and pinned: the pinned ones share
    one digest."""
    out = tmp_path / "kernel_pinning.json"
    stdout = _run("benchmarks/kernel_pinning.py", "--quick", "--json", str(out))
    results = json.loads(out.read_text())
    pinned = [row for row in results["identity"] if row["choice"] == "pinned"]
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import kernel_pinning

    levels = kernel_pinning.native_levels()  # the claim is about builds at different levels: the lowest and highest
    assert sorted(row["requested_aten"] for row in pinned) == sorted({levels[0], levels[-1]})
    assert pinned and all(row["aten"] == "DEFAULT" and row["mkl_cbwr"] == "COMPATIBLE,STRICT" for row in pinned)
    assert len(results["pinned_digests"]) == 1 and "pinned builds: 1 digest(s)" in stdout
