"""`ppm-trl estimate`: a run's judge requests, tokens, cost and wall time, projected before any model is loaded.

    ppm-trl estimate --config run.yaml [every flag of `ppm-trl train`] [--assume_... X] [--calibrate N] [--json F]
    ppm-trl estimate prepare --dataset my.jsonl --reference-column solution --judge-model M --out data/ [...]

Training: the YAML and flags are `train`'s, read by `train`'s own parser (`train.parse_train_args`), and the data goes
through `train`'s column mapping and checks. For a sample of rows (`--sample_rows`) a stand-in rollout is built —
the row's reference solution (else its reasoning points) repeated to `--assume_completion_tokens` policy tokens —
cut where the run's segmentation cuts it, and handed to the run's own scorer (`scorers.build_progress_scorer` /
`build_process_scorer`) in front of a judge that records its requests instead of sending them. So the requests a
rollout costs, and the prompts they carry, are the trainer's own: empty and unchanged prefixes are skipped and
identical ones sent once, as in training. `prepare`: its rows are read and skipped as `prepare` does; each distinct
row costs a points request and a graph request, whose points are assumed to be the reference's lines.

Judge tokens are counted with LiteLLM's `token_counter` (or ~4 characters a token when it cannot run); the
judge's answers are `--assume_judge_completion_tokens` long and take `--assume_latency_s`. `--calibrate N` sends N
of the recorded requests through the run's judge client (its transport, retries and rate limits; no cache) and
uses the measured prompt tokens (as a ratio to the local count), answer tokens and median latency instead. The
arithmetic — batches, steps, rate-limit bounds, cost — is `judge/projection.py`.

The pieces: `options.py` (the estimate's flags), `training.py` and `prepare.py` (the two estimates), `measure.py`
(recording, counting, pricing and calibrating requests), `report.py` (the table and the JSON file).
"""

from __future__ import annotations

import argparse

from ppm_trl.estimate.options import add_estimate_arguments, check_options
from ppm_trl.estimate.prepare import estimate_prepare
from ppm_trl.estimate.projection_report import report
from ppm_trl.estimate.training import estimate_training
from ppm_trl.flags import UsageError, closest
from ppm_trl.train import train_fields


def check_estimate_typos(rest: list[str], options_parser: argparse.ArgumentParser) -> None:
    """A mistyped estimate flag (`--assume_corect_fraction`) would reach `train`'s parser, which knows no estimate
    flag to suggest: name the closest one here."""
    known = {f"--{name}" for name in train_fields(rest)} | {"--config"}
    ours = {option: action.option_strings[0] for action in options_parser._actions for option in action.option_strings}
    for arg in rest:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and flag not in known and flag.replace("-", "_") not in known:
            close = list(dict.fromkeys(ours[option] for option in closest(flag, list(ours))))
            if close:
                raise UsageError(f"unknown flag {flag}; did you mean {' or '.join(close)}?")


def main(argv: list[str]) -> None:
    """`ppm-trl estimate [train flags]` or `ppm-trl estimate prepare [prepare flags]`, each with the estimate's."""
    argv = list(argv)
    if argv and argv[0] == "prepare":
        report(*estimate_prepare(argv[1:], __doc__))
        return
    if argv and argv[0] == "train":
        argv = argv[1:]
    options_parser = add_estimate_arguments(argparse.ArgumentParser(prog="ppm-trl estimate", add_help=False,
                                                                    allow_abbrev=False), training=True)
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        options_parser.print_help()
        print("\nand every flag and YAML key of `ppm-trl train` (`ppm-trl train --help`); `ppm-trl estimate prepare "
              "--help` for prepare's")
        return
    options, rest = options_parser.parse_known_args(argv)
    check_options(options)
    check_estimate_typos(rest, options_parser)
    estimate, limits = estimate_training(rest, options)
    report(estimate, limits, options.json)
