"""`training_curves.png` (ppm_trl.plots): one panel per kind of metric a run logged, none for the others."""

from __future__ import annotations

import pytest

from ppm_trl.plots import CURVES_FILE, curve_panels, plot_training_curves, save_training_curves


def _history(*entries: dict) -> list[dict]:
    """TRL-like log entries (one per logged step) and the trainer's final summary entry, which has no metrics."""
    return [{"step": step, **entry} for step, entry in enumerate(entries, start=1)] + [
        {"step": len(entries), "train_runtime": 3.0, "train_loss": 0.1}]


PPM = _history(*({"reward": 0.1 * s, "rewards/env_outcome_reward/mean": 0.1 * s, "ppm/final_progress": 0.2 * s,
                  "ppm/progress_segment_1": 0.1 * s, "ppm/progress_segment_2": 0.2 * s, "loss": 0.0}
                 for s in range(3)))
PAPO_WITH_JUDGE = _history(*({"reward": 0.5, "rewards/accuracy_reward/mean": 0.5, "rewards/format_reward/mean": 1.0,
                              "papo/proc_active_fraction": 0.25 * s, "judge/prompt_tokens": 1000.0,
                              "judge/completion_tokens": 50.0, "judge/cost": 0.002} for s in range(4)))
ARG = _history({"reward": 0.0, "arg/all_failure_groups": 2.0}, {"reward": 0.2, "arg/rescue_rate": 0.5},
               {"reward": 0.4, "arg/rescue_rate": float("nan")})


def _titles(history):
    return [panel.title for panel in curve_panels(history)]


def test_each_method_gets_its_own_panel_and_only_that():
    assert _titles(PPM) == ["reward", "PPM progress"]
    assert _titles(PAPO_WITH_JUDGE) == ["reward", "PAPO process-active share", "judge tokens (cumulative)",
                                        "judge cost (cumulative)"]
    assert _titles(ARG) == ["reward", "ARG rescue rate"]
    assert _titles([]) == [] and _titles([{"step": 1, "train_runtime": 1.0}]) == []


def test_panel_contents():
    progress = curve_panels(PPM)[1]
    assert list(progress.series) == ["final", "after segment 1", "after segment 2"]
    assert progress.series["final"] == ([1, 2, 3], [0.0, 0.2, 0.4])
    assert progress.thin == {"after segment 1", "after segment 2"}
    # One reward function: its mean is the total, not drawn twice; two functions: each beside the total.
    assert list(curve_panels(PPM)[0].series) == ["total"]
    reward, _, tokens, cost = curve_panels(PAPO_WITH_JUDGE)
    assert list(reward.series) == ["total", "accuracy_reward", "format_reward"]
    # The judge's metrics are per logging window: the panels add them up.
    assert tokens.series["prompt"] == ([1, 2, 3, 4], [1000.0, 2000.0, 3000.0, 4000.0])
    assert cost.series["cost"][1][-1] == pytest.approx(0.008)
    # ARG logs a rescue rate only in steps with an all-failure group; a NaN is no point.
    assert curve_panels(ARG)[1].series["rescue rate"] == ([2], [0.5])


def test_an_unpriced_judge_gets_no_dollar_panel():
    unpriced = [{**entry, "judge/cost": 0.0} for entry in PAPO_WITH_JUDGE]
    assert "judge cost (cumulative)" not in _titles(unpriced) and "judge tokens (cumulative)" in _titles(unpriced)


def test_plot_writes_a_png_with_the_panels(tmp_path):
    path = tmp_path / CURVES_FILE
    assert plot_training_curves(PAPO_WITH_JUDGE, str(path), "papo") == _titles(PAPO_WITH_JUDGE)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.png"
    assert plot_training_curves([], str(empty)) == [] and not empty.exists()


def test_without_matplotlib_the_curves_are_skipped_with_one_line(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    path, why = save_training_curves(PPM, str(tmp_path))
    assert path is None and why == f"no {CURVES_FILE}: matplotlib is not installed (pip install matplotlib)"
    assert not (tmp_path / CURVES_FILE).exists()
