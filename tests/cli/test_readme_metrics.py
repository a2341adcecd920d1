"""Every metric the README names is one the trainers log (a user searches their wandb/trackio run for it)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

ROOT = Path(__file__).resolve().parents[2]
# `ppm/final_progress`; a family is written with a wildcard (`arg/*`, `ppm/scorer_*`) or `_k` (`progress_segment_k`)
MENTION = re.compile(r"`((?:ppm|papo|arg|judge)/[a-z0-9_]+)`")


def logged_metric_names() -> set[str]:
    """The names the trainers log: every literal `"ppm/..."`, `"papo/..."`, `"arg/..."` in the package, the families
    built in f-strings (their keys are listed where they are logged), PAPO's stats and the judge callback's."""
    from ppm_trl.judge.callback import LOGGED
    from ppm_trl.papo.papo_estimators import PAPOStats

    source = "\n".join(path.read_text() for path in (ROOT / "ppm_trl").rglob("*.py"))
    names = set(re.findall(r"""["']((?:ppm|papo|arg)/[a-z0-9_]+)["']""", source))
    names |= {f"papo/{f.name}" for f in fields(PAPOStats)}
    names |= {f"papo/judge_{key}" for key in ("requests", "failures")}  # ppm_trl/papo/papo_trainer.py
    names |= {f"ppm/scorer_{key}" for key in ("requests", "skipped_empty", "skipped_unchanged", "deduplicated",
                                               "failures")}  # ppm_trl/ppm/ppm_trainer.py
    names |= {f"judge/{name}" for name in (*LOGGED, "quarantined_rows", "latency_p50", "latency_p95")}
    return names


def test_logged_names_are_read_from_the_code():
    names = logged_metric_names()
    # a few the trainers are known to log, so the scan itself cannot silently come up empty
    assert {"ppm/final_progress", "papo/proc_active_fraction", "arg/rescue_rate", "judge/calls"} <= names
    assert "judge/requests" not in names


def test_every_metric_the_readme_names_is_logged():
    mentioned = {name for name in MENTION.findall((ROOT / "README.md").read_text())
                 if not name.endswith("_k")}  # `ppm/progress_segment_k`: one per segment k
    assert len(mentioned) > 10
    assert not mentioned - logged_metric_names(), sorted(mentioned - logged_metric_names())
