"""`ppm-trl estimate`'s own flags (each in `train`'s underscore and `prepare`'s dash spelling) and their checks."""

from __future__ import annotations

import argparse
import os

from ppm_trl.flags import UsageError

DEFAULT_JUDGE_COMPLETION_TOKENS = 400
DEFAULT_LATENCY_S = 2.0
DEFAULT_SAMPLE_ROWS = 100

def add_estimate_arguments(parser: argparse.ArgumentParser, training: bool) -> argparse.ArgumentParser:
    """The estimate's own flags (each in `train`'s underscore and `prepare`'s dash spelling); the rest are the
    command's. `training`: also the assumptions that only a training run has."""
    group = parser.add_argument_group("estimate")

    def add(name: str, **kwargs):
        group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name, **kwargs)

    if training:
        add("assume_completion_tokens", type=int, default=None,
            help="Mean rollout length in policy tokens (default: max_completion_length, every rollout uses its whole "
                 "budget: an upper bound).")
        add("assume_correct_fraction", type=float, default=1.0,
            help="PAPO: the share of rollouts that are correct, each one rubric request (default 1: an upper bound).")
        add("assume_duplicate_fraction", type=float, default=0.0,
            help="The share of the requests that repeat an earlier one (identical problem and prefix, e.g. a policy "
                 "that repeats itself); the judge's cache answers those once. Default 0.")
        add("num_processes", type=int, default=max(int(os.environ.get("WORLD_SIZE", "1") or 1), 1),
            help="Training processes (accelerate launch --num_processes); they split the run's judge limits.")
    add("assume_judge_completion_tokens", type=int, default=DEFAULT_JUDGE_COMPLETION_TOKENS,
        help=f"Tokens of one judge answer (default {DEFAULT_JUDGE_COMPLETION_TOKENS}); measured with --calibrate.")
    add("assume_latency_s", type=float, default=DEFAULT_LATENCY_S,
        help=f"Seconds one judge request takes (default {DEFAULT_LATENCY_S:g}); measured with --calibrate.")
    add("sample_rows", type=int, default=DEFAULT_SAMPLE_ROWS,
        help=f"Rows whose judge requests are rendered and counted (default {DEFAULT_SAMPLE_ROWS}, at random).")
    add("calibrate", type=int, default=0, metavar="N",
        help="Send N real requests through the run's judge client to measure tokens and latency (they cost).")
    add("json", default=None, metavar="PATH", help="Also write the estimate as JSON to PATH.")
    return parser


MAX_TOKENS = 10_000_000  # more than any model's context: a larger assumption is a typo, not a workload
MAX_LATENCY_S = 3600.0  # an hour a request (inf or NaN would make every projection a traceback)


def check_options(options: argparse.Namespace) -> None:
    checks = [("sample_rows", options.sample_rows >= 1, ">= 1"), ("calibrate", options.calibrate >= 0, ">= 0"),
              ("assume_judge_completion_tokens", 0 <= options.assume_judge_completion_tokens <= MAX_TOKENS,
               f"in [0, {MAX_TOKENS:,}] (tokens of one judge answer)"),
              ("assume_latency_s", 0 <= options.assume_latency_s <= MAX_LATENCY_S,
               f"a finite number of seconds in [0, {MAX_LATENCY_S:g}]")]
    if hasattr(options, "assume_correct_fraction"):
        checks += [("assume_correct_fraction", 0.0 <= options.assume_correct_fraction <= 1.0, "in [0, 1]"),
                   ("assume_duplicate_fraction", 0.0 <= options.assume_duplicate_fraction < 1.0, "in [0, 1)"),
                   ("num_processes", options.num_processes >= 1, ">= 1"),
                   ("assume_completion_tokens", options.assume_completion_tokens is None
                    or 1 <= options.assume_completion_tokens <= MAX_TOKENS, f"in [1, {MAX_TOKENS:,}]")]
    for name, ok, rule in checks:
        if not ok:
            raise UsageError(f"--{name} must be {rule}, got {getattr(options, name)!r}")

