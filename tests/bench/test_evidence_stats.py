"""The evidence suite's statistics (issue 40 items 1, 2, 5), by hand: censored samples-to-target, Kaplan–Meier
medians, paired and clipped intervals, the shared lr, tuning noise — and the PPM comparison that uses them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


def test_kaplan_meier_median_counts_censored_runs_at_risk():
    from evidence_stats import km_median

    assert km_median([100, None, 300], 1000) == 300  # Ŝ(100) = 2/3, Ŝ(300) = 1/3
    assert km_median([100, None, None], 1000) is None  # Ŝ never reaches ½: the median is beyond the budget
    assert km_median([None, 200, 200, 400], 1000) == 200  # two events at once: Ŝ(200) = ½
    assert km_median([640, 640, 1280], 6400) == 640
    with pytest.raises(ValueError, match="above the budget"):
        km_median([7000], 6400)


def test_ratio_by_seed_keeps_every_seed_as_a_value_or_a_bound():
    from evidence_stats import fmt_ratio, km_ratio, ratio_by_seed

    ratios = ratio_by_seed([640, None, 1280, None], [320, 640, None, None], 6400)
    assert ratios == [2.0, {"lower": 10.0}, {"upper": 0.2}, {"censored": True}]
    assert [fmt_ratio(r) for r in ratios] == ["2.00", "≥ 10.00", "≤ 0.20", "censored"]
    # GRPO never reaches it on any seed, PPM's KM median is 1280: the ratio is at least 6400 / 1280.
    assert km_ratio([None, None, None], [640, 1280, None], 6400) == {"lower": 5.0}
    assert km_ratio([None, None, None], [None, None, 640], 6400) is None
    assert km_ratio([1280, 1280, None], [640, 640, 640], 6400) == 2.0


def test_a_target_the_warm_start_already_meets_gives_no_ratio():
    """At an easy horizon both arms meet the target at the step-0 evaluation (0 samples): no ratio (0 / 0), the seed
    kept and counted; one arm alone at 0 cannot happen (same warm start, prompts and seed) and is an error."""
    from evidence_stats import fmt_ratio, km_ratio, log_t_ratio, ratio_by_seed

    ratios = ratio_by_seed([0, 640, 0], [0, 320, 0], 6400)
    assert ratios == [{"at_start": True}, 2.0, {"at_start": True}]
    assert fmt_ratio(ratios[0]) == "both at step 0" and km_ratio([0, 0, 640], [0, 0, 320], 6400) == {"at_start": True}
    summary = log_t_ratio(ratios)
    assert summary["at_start"] == 2 and summary["exact"] == 1 and summary["geometric_mean"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="only one arm met the target before training"):
        ratio_by_seed([640], [0], 6400)


def test_log_t_ratio_averages_exact_ratios_and_counts_the_bounds():
    from evidence_stats import log_t_ratio

    summary = log_t_ratio([2.0, 8.0, {"lower": 3.0}, {"censored": True}])
    assert summary["exact"] == 2 and summary["lower_bounds"] == 1 and summary["censored"] == 1
    assert summary["geometric_mean"] == pytest.approx(4.0)
    half = 12.706 * (math.log(8) - math.log(2)) / math.sqrt(2) / math.sqrt(2)  # t(1) · s / √2
    assert summary["ci95"] == pytest.approx([4.0 * math.exp(-half), 4.0 * math.exp(half)])
    assert log_t_ratio([{"censored": True}])["geometric_mean"] is None


def test_intervals_are_clipped_to_what_a_rate_or_a_gap_can_be():
    from evidence_stats import paired_gap, rate_interval, t_interval

    mean, interval = rate_interval([0.0, 0.0, 0.1])
    assert mean == pytest.approx(0.1 / 3) and interval[0] == 0.0 and interval[1] < 1
    assert t_interval([0.0, 0.0, 0.1])[1][0] < 0  # unclipped, the same values go below 0
    gap = paired_gap([1.0, 0.0, 1.0], [0.0, 0.0, 0.0])
    assert gap["per_seed"] == [1.0, 0.0, 1.0] and gap["mean"] == pytest.approx(2 / 3)
    half = 4.303 * math.sqrt(1 / 3) / math.sqrt(3)
    assert gap["ci95"] == pytest.approx([2 / 3 - half, 1.0])  # the high end clipped to 1
    with pytest.raises(ValueError, match="one value per seed"):
        paired_gap([0.1, 0.2], [0.1])


def test_shared_lr_is_the_best_lr_on_average_among_those_every_arm_ran():
    from evidence_stats import shared_lr

    grids = {"sparse": {1e-4: {"score": [0.1, 0.5]}, 3e-4: {"score": [0.3, 0.5]}},
             "lines": {1e-4: {"score": [0.5, 0.7]}, 3e-4: {"score": [0.2, 0.7]}, 1e-3: {"score": [0.9, 0.9]}}}
    assert shared_lr(grids) == 1e-4  # mean 0.30 vs 0.25; 1e-3 (lines' best) is not in every grid
    assert shared_lr({"sparse": {}, "lines": grids["lines"]}) is None


def test_tuning_noise_compares_best_and_runner_up_with_the_larger_standard_error():
    from evidence_stats import tuning_noise

    grid = {1e-4: {"per_seed": [0.02, 0.03], "score": [0.025, 0.5]},
            3e-4: {"per_seed": [0.0, 0.01], "score": [0.005, 0.5]},
            1e-3: {"per_seed": [0.0, 0.0], "score": [0.0, 0.1]}}
    se = math.sqrt((0.025 * 0.975 + 0.005 * 0.995) / (2 * 256))  # the per-seed differences agree: SE 0
    noise = tuning_noise(grid, 256)
    assert noise["runner_up"] == 3e-4 and noise["difference"] == pytest.approx(0.02)
    assert noise["se_seeds"] == pytest.approx(0, abs=1e-12) and noise["se"] == pytest.approx(se) and noise["inside_noise"] is False
    assert tuning_noise(grid, 64)["inside_noise"] is True  # a quarter of the prompts: twice the SE
    # OPSD at n = 8: every lr ends at 0 (ties broken by per-sub-problem) — a difference of 0 ± 0 is no evidence
    collapsed = {lr: {"per_seed": [0.0, 0.0], "score": [0.0, sub]} for lr, sub in ((3.33e-6, 0.32), (1e-5, 0.057))}
    tied = tuning_noise(collapsed, 256)
    assert (tied["runner_up"], tied["difference"], tied["se"], tied["inside_noise"]) == (1e-5, 0.0, 0.0, True)


class FakeRunner:
    """Scripted runs: all-correct rises by `rate[variant] · lr-fit` per evaluation; a rate of 0 never moves."""

    def __init__(self, best_lr):
        self.best_lr, self.specs = best_lr, []

    def run(self, specs):
        self.specs.extend(specs)
        return {(s.variant, s.n, s.learning_rate, s.seed): self.result(s) for s in specs}

    def result(self, s):
        fit = max(0.0, 1 - abs(math.log10(s.learning_rate / self.best_lr[s.variant])))
        speed = {"sparse": 0.02, "trajectory": 0.03, "lines_answer": 0.05, "lines": 0.05, "segment": 0.04,
                 "verifree": 0.02, "opsd": 0.01}[s.variant] * fit
        if s.variant == "sparse" and s.seed == 1:
            speed = 0.0  # GRPO never takes off on reporting seed 1: a censored seed
        history = [{"step": step, "samples": step * 64, "all_correct": min(1.0, speed * step / 10),
                    "greedy_all_correct": min(1.0, speed * step / 5), "per_subproblem": 0.5}
                   for step in range(0, s.max_steps + 1, s.eval_every)]
        return {"spec": {"learning_rate": s.learning_rate}, "history": history, "train_logs": []}


def test_ppm_comparison_tunes_every_horizon_and_reports_own_and_shared_lrs(tmp_path):
    import evidence
    from evidence_ppm import PPM_HARDEST_ONLY, PPM_VARIANTS, compare

    args = evidence.parse_args(["--output-dir", str(tmp_path), "--horizons", "2", "4", "--ppm-steps", "100",
                                "--seeds", "0", "1", "2"])
    runner = FakeRunner({"sparse": 3e-5, "trajectory": 1e-4, "lines_answer": 3e-4, "lines": 1e-4, "segment": 1e-4,
                         "verifree": 1e-4, "opsd": 1e-4})
    profile = {n: {"all_correct": 0.1} for n in (2, 4)}
    tables = []
    out = compare(args, runner, "multi_add", "f" * 16, profile, [2, 4], PPM_VARIANTS, PPM_HARDEST_ONLY, tables, "PPM")
    # Every arm tuned at both horizons (segment at the hardest only); each grid's best is its scripted optimum.
    assert out["best_lr_by_n"]["2"] == {"sparse": 3e-5, "trajectory": 1e-4, "lines_answer": 3e-4}
    assert out["best_lr_by_n"]["4"]["segment"] == 1e-4 and out["best_lr_by_n"]["4"]["lines"] == 1e-4
    assert {(s.n, s.variant) for s in runner.specs if s.seed in args.tuning_seeds} == {
        (n, v) for n in (2, 4) for v in PPM_VARIANTS} | {(4, v) for v in PPM_HARDEST_ONLY}
    assert set(PPM_HARDEST_ONLY) == {"segment", "lines", "verifree", "opsd"}
    assert out["best_lr_by_n"]["4"]["verifree"] == 1e-4 and out["best_lr_by_n"]["4"]["opsd"] == 1e-4
    # The shared lr is in every grid and best on average (1e-4); every arm also ran there on the reporting seeds.
    assert out["shared_lr_by_n"] == {"2": 1e-4, "4": 1e-4}
    reported = {(s.variant, s.n, s.learning_rate) for s in runner.specs if s.seed in args.seeds}
    assert ("sparse", 2, 1e-4) in reported and ("sparse", 2, 3e-5) in reported
    assert ("lines_answer", 4, 1e-4) in reported
    # matched_lr: final all-correct at the shared lr, mean over seeds (GRPO at 1e-4: fit 1 − log10(10/3), seed 1 flat).
    fit = 1 - math.log10(1e-4 / 3e-5)
    assert out["matched_lr"]["2"]["sparse"] == pytest.approx(2 * min(1.0, 0.02 * fit * 10) / 3)
    # Samples-to-target at n = 4 (target 0.65^4 = 0.179): lines reach it at step 40 on every seed; GRPO at step 90
    # on seeds 0 and 2, never on seed 1 — which stays in the summary as a lower bound, not dropped.
    assert out["km_median"]["4"]["lines_answer"] == 40 * 64 and out["km_median"]["4"]["sparse"] == 90 * 64
    assert out["ratio_by_seed"]["4"] == [pytest.approx(90 / 40), {"lower": 6400 / (40 * 64)}, pytest.approx(90 / 40)]
    assert out["ratio_median"] == pytest.approx(90 / 40) and out["censored"] is True
    assert out["ratio_summary"]["exact"] == 2 and out["ratio_summary"]["lower_bounds"] == 1
    gap = out["details"]["4"]["own"]["gap"]
    assert gap["per_seed"] == pytest.approx([0.5 - 0.2, 0.5, 0.5 - 0.2])
    assert out["gap_paired_by_n"]["4"][0] == pytest.approx(gap["mean"])
    assert out["share_reached_by_budget"]["4"]["sparse"][6400] == pytest.approx(2 / 3)
    text = "\n".join(tables)
    assert "lr grid at n = 4" in text and "lr grid at n = 2" in text and "shared lr" in text and "≥ 2.50" in text
    assert (tmp_path / "ppm_horizons.png").exists()


def test_answer_form_reads_the_kept_completions_last_line():
    from evidence_ppm import answer_form

    def run(*texts):
        return {"history": [{"completions": [{"completion": text} for text in texts]}]}

    good = "a:1+1=2\nb:2+2=4\n\\boxed{a=2,b=5}"  # wrong sum, right form
    garbled = "a:1+1=2\nb:2+2=4\n\\boxed{a=55\ufffd41,d=22,e=d=17}"
    short = "a:1+1=2\n\\boxed{a=2}"  # one item where n = 2 needs two
    repeated = "\\boxed{a=2,a=4}"
    assert answer_form(run(good, garbled, short, repeated), 2) == 0.25
    assert answer_form(run("x\n\\boxed{-9}\n"), 2) == 1.0  # chain_add's answer line
    assert answer_form({"history": [{}]}, 2) is None  # a run file from before completions were kept


def test_a_rerun_is_judged_on_every_number_the_stored_run_has():
    """A measurement added after a run was stored (`kl_to_start`) is reported, not counted as a difference; a stored
    number that changes or goes missing is one; timings are never compared."""
    from evidence_rerun import added_keys, differences

    stored = {"history": [{"step": 0, "all_correct": 0.5}], "train_logs": [{"loss": 1.0, "step_time": 3.0}]}
    rerun = {"history": [{"step": 0, "all_correct": 0.5, "kl_to_start": 0.0}],
             "train_logs": [{"loss": 1.0, "step_time": 9.0}]}
    assert differences(stored, rerun) == [] and added_keys(stored, rerun) == ["history.kl_to_start"]
    changed = {**rerun, "history": [{"step": 0, "all_correct": 0.25, "kl_to_start": 0.0}]}
    assert differences(stored, changed) == ["history[0].all_correct: stored 0.5, rerun 0.25"]
    lost = {**rerun, "train_logs": [{"step_time": 9.0}]}
    assert differences(stored, lost) == ["train_logs[0].loss: stored 1.0, rerun None"]
    shorter = {**rerun, "history": []}
    assert differences(stored, shorter) == ["history: 1 entries stored, 0 rerun"]


def test_a_stored_profile_spares_the_build_only_where_asked(tmp_path, monkeypatch):
    import json

    import evidence
    import evidence_protocol

    built = []
    monkeypatch.setattr(evidence_protocol, "warm_start", lambda settings, **_: built.append(settings) or "/ws")
    monkeypatch.setattr(evidence_protocol, "read_manifest", lambda path: {"weights_digest": "f" * 16})
    args = evidence.parse_args(["--output-dir", str(tmp_path)])
    entry = {"all_correct": 0.1, "per_subproblem": 0.5, "per_point": [0.5]}
    (tmp_path / "profile_chain_add_sft1400.json").write_text(
        json.dumps({"fingerprint": "f" * 16, "profile": {"2": entry, "3": entry}}))
    assert evidence_protocol.pinned_warm_start(args, "chain_add", [2, 3], "_sft1400", profile_only=True,
                                               max_steps=1400) == ("", "f" * 16, {2: entry, 3: entry})
    assert built == []
    # Not asked (a run needs the checkpoint): built, checked against the stored fingerprint, profile not redone.
    assert evidence_protocol.pinned_warm_start(args, "chain_add", [2, 3], "_sft1400", max_steps=1400)[0] == "/ws"
    assert [s.max_steps for s in built] == [1400]
    # A horizon the stored profile lacks: the warm start is built (and profiled) even when a profile is enough.
    monkeypatch.setattr(evidence_protocol, "profile_warm_start", lambda path, env, ns, size: {n: entry for n in ns})
    assert evidence_protocol.pinned_warm_start(args, "chain_add", [2, 4], "_sft1400", profile_only=True,
                                               max_steps=1400)[0] == "/ws"
    assert len(built) == 2


def test_robust_start_builds_only_the_candidate_it_uses(tmp_path, monkeypatch):
    import evidence
    import evidence_ppm

    calls, used = [], {}
    stored = {1400, 1300}  # candidates profiled by an earlier session; 1350 never was

    def fake_pinned_warm_start(args, env, horizons, label="", profile_only=False, max_steps=None):
        calls.append((max_steps, profile_only))
        path = "" if profile_only and max_steps in stored else f"/ws/{max_steps}"
        return path, f"fp{max_steps}", {n: {"cliff": 4 if max_steps == 1300 else None} for n in horizons}

    monkeypatch.setattr(evidence_ppm, "pinned_warm_start", fake_pinned_warm_start)
    monkeypatch.setattr(evidence_ppm, "choose_horizons",
                        lambda profile: ({"cliff": next(iter(profile.values()))["cliff"]}, {}))
    monkeypatch.setattr(evidence_ppm, "Runner", lambda args, env, path, name: used.setdefault("path", path))
    monkeypatch.setattr(evidence_ppm, "compare", lambda *a, **k: {})
    args = evidence.parse_args(["--output-dir", str(tmp_path), "--robust-sft-steps", "1400", "1300", "1350"])
    summary = {}
    evidence_ppm.ppm_robust_part(args, summary, [])
    # 1400 has no cliff: read from its stored profile, never built; 1300 has one: built, and its checkpoint used.
    assert calls == [(1400, True), (1300, True), (1300, False)]
    assert used["path"] == "/ws/1300"
    robust = summary["ppm_robust"]
    assert robust["sft_steps"] == 1300 and robust["cliff"] == 4 and robust["warm_start_fingerprint"] == "fp1300"
    assert list(robust["warm_starts_tried"]) == ["1400", "1300"]
    assert robust["warm_starts_tried"]["1400"]["warm_start_fingerprint"] == "fp1400"


def test_a_rerun_builds_the_warm_start_its_runs_folder_recorded():
    """`runs/chain_add_sft725/` was measured on chain_add's SFT stopped at 725 steps, not on the recipe's 1,542: the
    rerun reads the settings and the fingerprint from that folder's profile."""
    from evidence_rerun import recorded_warm_start, run_folder

    from ppm_trl.demo.warmstart import WarmStartSettings

    results = REPO / "benchmarks" / "results" / "evidence_v3"
    assert run_folder("runs/chain_add_sft725/lines_answer_n2_lr0.0001_s0_100st.json") == "chain_add_sft725"
    settings, fingerprint = recorded_warm_start(str(results), "chain_add_sft725")
    assert settings == WarmStartSettings.for_env("chain_add", max_steps=725) and fingerprint == "614e191a24c3194e"
    assert recorded_warm_start(str(results), "multi_add")[0] == WarmStartSettings.for_env("multi_add")
    with pytest.raises(SystemExit, match="expected runs/<folder>/<file>.json"):
        run_folder("lines_n2_lr0.0001_s0_100st.json")
