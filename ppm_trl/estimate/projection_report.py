"""The estimate as printed and written: the workload table (per step or row, whole run), the assumptions, notes
on where a judge budget would stop the run, and the JSON file."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from ppm_trl.estimate.measure import Calibration, Sample
from ppm_trl.judge import projection


# ---------------------------------------------------------------------------------------------- the report
@dataclass
class Estimate:
    """Everything `ppm-trl estimate` prints and writes."""

    command: str
    headline: str
    judged: str
    lines: list[tuple[str, projection.Workload]]
    assumptions: list[str]
    notes: list[str]
    data: dict[str, Any]


def workload_table(lines: list[tuple[str, projection.Workload]], limits: projection.JudgeLimits) -> str:
    """The small table: one line per scope (per step, whole run)."""
    def cost(w):
        if w.cost_usd is None:
            return "unpriced"
        return f"${w.cost_usd:,.4f}" if w.cost_usd < 100 else f"${w.cost_usd:,.0f}"

    def bound(seconds, limited):
        return projection.format_seconds(seconds) if limited else "no limit"

    header = ["", "requests", "prompt tokens", "completion tokens", "cost", "time at rpm", "time at tpm",
              "time at concurrency × latency", "projected"]
    rows = [header] + [[name, f"{w.requests:,.0f}", f"{w.prompt_tokens:,.0f}", f"{w.completion_tokens:,.0f}",
                        cost(w), bound(w.seconds_rpm, limits.max_rpm is not None),
                        bound(w.seconds_tpm, limits.max_tpm is not None),
                        projection.format_seconds(w.seconds_concurrency), projection.format_seconds(w.seconds)]
                       for name, w in lines]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths))) for row in rows)


def report(estimate: Estimate, limits: projection.JudgeLimits | None, json_path: str | None) -> None:
    print(f"ppm-trl estimate: {estimate.headline}")
    if limits is not None:
        print(f"judged: {estimate.judged}")
        print(workload_table(estimate.lines, limits))
        print("assumptions:")
        for line in estimate.assumptions:
            print(f"  - {line}")
    for line in estimate.notes:
        print(f"note: {line}")
    if json_path:
        payload = {"command": estimate.command, "headline": estimate.headline, "judged": estimate.judged,
                   **{name.split(" (")[0].replace(" ", "_"): w.to_dict() for name, w in estimate.lines},
                   "assumptions": estimate.assumptions, "notes": estimate.notes, **estimate.data}
        directory = os.path.dirname(os.path.abspath(json_path))
        os.makedirs(directory, exist_ok=True)
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
        print(f"ppm-trl estimate: wrote {json_path}")


def profile_of(samples: list[Sample], calibration: Calibration | None, options,
               requests_per_unit: float | None = None) -> tuple[projection.RequestProfile, list[str]]:
    """Mean requests a unit, prompt and answer tokens a request (calibrated when measured), and what was assumed."""
    requests = [len(s.requests) for s in samples]
    tokens = [t for s in samples for t in s.tokens]
    prompt = sum(tokens) / len(tokens) if tokens else 0.0
    completion = float(options.assume_judge_completion_tokens)
    said = []
    if calibration is not None and calibration.prompt_ratio is not None:
        prompt *= calibration.prompt_ratio
        completion = calibration.completion_tokens
        said.append(f"judge tokens measured by --calibrate {calibration.sent}: prompts "
                    f"{calibration.prompt_ratio:.3f}× the local count, answers {completion:,.0f} tokens")
    else:
        said.append(f"judge answers: {completion:,.0f} tokens each (--assume_judge_completion_tokens)"
                    + ("; --calibrate got no token usage from the server" if calibration is not None else ""))
    per_unit = sum(requests) / len(requests) if requests_per_unit is None else requests_per_unit
    return projection.RequestProfile(per_unit, prompt, completion), said


def latency_of(calibration: Calibration | None, options) -> tuple[float, str]:
    if calibration is not None:
        return calibration.latency_s, (f"latency {calibration.latency_s:.2f} s a request (median of --calibrate "
                                       f"{calibration.sent}; {calibration.failures} failed)")
    return options.assume_latency_s, f"latency {options.assume_latency_s:g} s a request (--assume_latency_s)"



def budget_notes(per_unit: projection.Workload, max_cost_usd, max_total_tokens, units: int, unit: str) -> list[str]:
    """Where a judge budget would stop the run, if it is set."""
    notes = []
    for budget, amount, flag in ((max_cost_usd, per_unit.cost_usd, "judge_max_cost_usd"),
                                 (max_total_tokens, per_unit.total_tokens, "judge_max_total_tokens")):
        if budget is None:
            continue
        if amount is None:
            notes.append(f"{flag}={budget:g} cannot be kept: the judge model is unpriced")
            continue
        lasts = projection.steps_within_budget(amount, budget)
        if lasts is not None and lasts < units:
            notes.append(f"{flag}={budget:g} would stop the run after about {math.ceil(lasts):,} of {units:,} {unit}s")
        elif lasts is not None:
            notes.append(f"{flag}={budget:g} lasts the whole run (about {lasts:,.0f} {unit}s' worth)")
    return notes

