"""`ppm-trl estimate prepare [prepare flags]`: `prepare`'s own flags, rows and skips; each distinct row costs a
points request and a graph request, whose points are assumed to be the reference's lines."""

from __future__ import annotations

import json
import os

from ppm_trl.estimate.measure import (
    RecordingJudge,
    Sample,
    calibrate,
    count_samples,
    judge_prices,
    judge_token_counter,
    sampled,
)
from ppm_trl.estimate.options import add_estimate_arguments, check_options
from ppm_trl.estimate.projection_report import Estimate, budget_notes, latency_of, profile_of
from ppm_trl.judge import projection


def finished_rows(path: str) -> set[str]:
    """The row fingerprints an earlier `prepare` already wrote to its progress file (`row_fingerprint`: it resumes
    without the rows that still read the same); a record it did not write is not a finished row."""
    if not os.path.exists(path):
        return set()
    done = set()
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("row"), str):
                done.add(record["row"])
    return done


def estimate_prepare(argv: list[str],
                     description: str | None = None) -> tuple[Estimate, projection.JudgeLimits, str | None]:
    from ppm_trl import prepare as prep
    from ppm_trl.columns import is_solution_column
    from ppm_trl.judge import build_judge

    parser = add_estimate_arguments(prep.prepare_parser("ppm-trl estimate prepare", description), training=False)
    options = parser.parse_args(prep.normalize_flags(argv, parser))
    check_options(options)
    if options.points_column is not None:
        raise ValueError("--points-column: `prepare` reads the points the dataset already has and calls no judge, so "
                         "it costs no requests; estimate `train` instead")
    settings = prep.judge_settings(options)
    dataset = prep.load_rows(options)
    prep.check_prepare_columns(dataset, options)
    # Read lazily, only the columns prepare reads: a 45 MB file made `to_list()` hold 1.2 GB.
    rows = dataset.select_columns(list(dict.fromkeys(
        c for c in (options.problem_column, options.reference_column, options.answer_column) if c)))
    solution_column = options.answer_column is not None and (
        options.answer_column == options.reference_column or is_solution_column(dataset[options.answer_column]))
    finished = finished_rows(os.path.join(prep.work_dir_of(options), prep.PROGRESS_FILE))
    jobs, unusable, done = [], 0, 0
    for index, row in enumerate(rows):  # read as `prepare` reads them: an unusable row costs no request
        try:
            problem = prep.problem_of(row[options.problem_column], options.problem_column, index)
            reference = prep.reference_of(row[options.reference_column], options.reference_column, index)
            answer, _ = prep.answer_of(row, options, index, solution_column)
        except ValueError:
            unusable += 1
            continue
        if answer is None:
            unusable += 1
            continue
        if prep.row_fingerprint(problem, reference, answer) in finished:
            done += 1
            continue
        jobs.append((index, problem, reference, answer))
    groups = prep.duplicate_groups(jobs)
    headline = (f"prepare {options.dataset}: {len(rows):,} rows, {done:,} already done, {unusable:,} unusable "
                f"(no request), {len(jobs) - len(groups):,} duplicates (judged once): {len(groups):,} rows to judge")
    judged = "each distinct row: its reasoning points (App. D rubric prompt), then their obsoletion graph"
    recorder = RecordingJudge()
    samples = []
    for position in sampled(len(groups), options.sample_rows):
        _, problem, reference, answer = groups[position][0]
        recorder.generate_points(problem, reference, answer)
        points = [line.strip() for line in reference.splitlines() if line.strip()] or [reference.strip()]
        recorder.generate_graph(problem, points)
        samples.append(Sample(recorder.take()))
    count, counter_said = judge_token_counter(options.judge_model)
    count_samples(samples, count, settings.judge_echo_nonce)
    calibration = None
    if options.calibrate and samples:
        judge = build_judge(settings, cache_dir=None, max_cost_usd=None, max_total_tokens=None)
        calibration = calibrate(judge, samples, options.calibrate)
    profile, tokens_said = (profile_of(samples, calibration, options) if samples else
                            (projection.RequestProfile(2.0, 0.0, 0.0), []))
    latency, latency_said = latency_of(calibration, options)
    limits = projection.JudgeLimits(settings.judge_max_rpm, settings.judge_max_tpm, settings.judge_max_concurrency,
                                    latency)
    prices, prices_said = judge_prices(options.judge_model, profile.prompt_tokens, profile.completion_tokens)
    run = projection.batch_workload(len(groups), profile, limits, prices, chained=2)  # points, then the graph
    per_row = run.scaled(1 / len(groups)) if groups else run
    assumptions = [
        "each distinct row: one points request and one graph request (no retries: an answer whose last point does "
        "not state the gold answer is asked again, and would cost more)",
        "the graph request's points: one per non-empty line of the reference solution (the judge writes its own)",
        f"judge prompts: the App. D prompts rendered on {len(samples)} sampled row(s), {profile.prompt_tokens:,.0f} "
        f"tokens on average, counted with {counter_said}",
        *tokens_said, latency_said, f"cost: {prices_said}",
        "wall time is the judge's own (the slowest of the three bounds), rate limits at their steady rate; "
        "answers already in the judge cache are not subtracted",
    ]
    notes = budget_notes(per_row, settings.judge_max_cost_usd, settings.judge_max_total_tokens, len(groups), "row")
    data = {"rows": len(rows), "done": done, "unusable": unusable, "to_judge": len(groups),
            "judge_model": options.judge_model, "profile": profile.__dict__,
            "calibration": None if calibration is None else calibration.to_dict(),
            "options": {k: getattr(options, k) for k in ("assume_judge_completion_tokens", "assume_latency_s",
                                                          "sample_rows", "calibrate")},
            "token_counter": counter_said, "prices": prices_said, "limits": limits.__dict__}
    lines = [("per row", per_row), (f"whole run ({len(groups):,} rows)", run)]
    return Estimate("prepare", headline, judged, lines, assumptions, notes, data), limits, options.json

