"""Each paper's headline, measured the way its paper measures it, under one protocol (issue 30).

    python benchmarks/evidence.py --parts ppm --workers 2        # one part; resumes from the cached runs
    python benchmarks/evidence.py --parts ppm --plan             # what is cached and what is left (trains nothing)
    python benchmarks/evidence.py --summarize-only               # summary.json, tables.md and plots from the cache
    python benchmarks/evidence.py --quick                        # CI smoke (tiny warm starts, 2 steps)

**Protocol** (all parts). Every run is one `ppm_trl.demo.train_variant` on one thread with deterministic algorithms
and the pinned kernels (`ppm_trl.demo.kernels`: the script re-executes itself with them, so any x86-64 CPU computes
the same numbers), cached as JSON under `--output-dir/runs/` (so the suite runs in pieces, across sessions and
machines). Learning rates: a grid of ≥ 3 values per variant (`--lrs`) at every reported horizon and task, each
variant at its best value by
mean final all-correct at T = 1 (ties: per-sub-problem accuracy) over the *tuning* seeds (`--tuning-seeds`), evaluated
on a *tuning* prompt set; a variant whose best value sits at an edge of its grid gets the grid extended on that side
(×/÷ `--lr-step`, up to `--max-extensions` times). Reported: the *reporting* seeds (`--seeds`, disjoint from the tuning
seeds) on `--eval-size` held-out prompts disjoint from the tuning prompts, evaluated at T = 1 and greedy (and pass@k
where the paper reports it), mean with a t-based 95 % interval, paired by seed between variants (every variant of a
part starts from the same warm start and sees the same prompts in the same order for a given seed). A samples-to-target
that a run never reaches is censored and shown as "> budget", never as a number.

Parts (each in its own module): **ppm** and **ppm_robust** (`evidence_ppm.py`, PPM §5.2 Table 1, Fig. 4),
**papo** (`evidence_papo.py`, PAPO §5.3, §6, §3.2), **arg** (`evidence_arg.py`, ARG §5, App. G.2); the protocol
they share is `evidence_protocol.py`, its statistics `evidence_stats.py`.

Everything reported goes to `--output-dir/summary.json` (written from the runs), tables to `tables.md`, plots next to
them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from common import RESULTS
from evidence_arg import arg_part
from evidence_papo import papo_part
from evidence_ppm import ppm_part, ppm_robust_part
from evidence_protocol import PENDING

from ppm_trl.demo.kernels import pin_kernels

PARTS = ["ppm", "ppm_robust", "papo", "arg"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    parser.add_argument("--horizons", type=int, nargs="+", default=[2, 4, 6, 8], help="PPM's horizons n.")
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4], help="The lr grid (≥ 3 values).")
    parser.add_argument("--lr-step", type=float, default=3.0, help="Factor by which an edge grid is extended.")
    parser.add_argument("--max-extensions", type=int, default=2, help="Extensions of a grid per side, at most.")
    parser.add_argument("--tuning-seeds", type=int, nargs="+", default=[100, 101])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Reporting seeds.")
    parser.add_argument("--arg-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                        help="ARG's reporting seeds (≥ 5: GRPO either takes off or not on this task).")
    parser.add_argument("--ppm-steps", type=int, default=100, help="PPM RL steps per run (64 samples each).")
    parser.add_argument("--papo-steps", type=int, default=60)
    parser.add_argument("--arg-steps", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--prompts-per-step", type=int, default=8, help="Distinct prompts per RL step.")
    parser.add_argument("--num-generations", type=int, default=8, help="G, samples per prompt (and ARG's K).")
    parser.add_argument("--eval-size", type=int, default=256, help="Held-out (and tuning) prompts per evaluation.")
    parser.add_argument(
        "--target-line", type=float, default=0.65, help="PPM's target at horizon n is all-correct ≥ target_line ** n."
    )
    parser.add_argument("--papo-n", type=int, default=3, help="PAPO's horizon.")
    parser.add_argument(
        "--robust-sft-steps",
        type=int,
        nargs="+",
        default=[1542, 1400, 1300, 800, 775, 750, 725, 712, 700],
        help="ppm_robust's chain_add warm starts, tried in order: the recipe (1,542 SFT steps), then the "
        "same recipe stopped earlier, longest first, closing in on the jump in which it learns the task "
        "(under the kernel pin: 750 steps and more, no cliff, every horizon above 0.1; 700, line 2 right "
        "0.04 of the time); the first whose profile has a cliff is used.",
    )
    parser.add_argument("--profile-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1, help="Runs in parallel (processes, one thread each).")
    parser.add_argument(
        "--output-dir",
        default=os.path.join(RESULTS, "evidence_v3"),
        help="Runs, profiles and summary (default: protocol 3's, under the pinned kernels; "
        "benchmarks/results/evidence holds protocol 2's, measured before the pin).",
    )
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache root.")
    parser.add_argument("--tune-only", action="store_true", help="Stop each part after its lr grid.")
    parser.add_argument("--plan", action="store_true", help="Print what is cached and what is left; train nothing.")
    parser.add_argument("--summarize-only", action="store_true", help="Train nothing; summarise the cached runs.")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny warm starts, 2 steps, 1 seed.")
    args = parser.parse_args(argv)
    if args.quick:
        args.output_dir += "_quick"
        # one lr: own and shared lr coincide, so each arm is reported once (the tuning logic has its unit tests)
        args.horizons, args.lrs, args.tuning_seeds, args.seeds, args.arg_seeds = [1, 2], [1e-3], [100], [0, 1], [0]
        args.ppm_steps = args.papo_steps = args.arg_steps = 2
        args.eval_every, args.eval_size, args.profile_size, args.max_extensions, args.papo_n = 2, 8, 8, 0, 2
        args.prompts_per_step = 1  # one group of G a step: the smoke checks the machinery, not learning
    if len(args.lrs) < 3 and not args.quick:
        parser.error("--lrs needs at least three values (a grid that can bracket an optimum)")
    for flag, seeds in (("--seeds", args.seeds), ("--arg-seeds", args.arg_seeds)):
        if set(args.tuning_seeds) & set(seeds):
            parser.error(f"--tuning-seeds and {flag} must be disjoint; both have "
                         f"{sorted(set(args.tuning_seeds) & set(seeds))}")
    args.plan_only = args.plan or args.summarize_only
    return args


# ------------------------------------------------------------------------------------------------------------ main
def main(argv=None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    summary_path = os.path.join(args.output_dir, "summary.json")
    summary: dict = {}
    if os.path.exists(summary_path):  # parts not run now keep what an earlier invocation wrote
        with open(summary_path) as handle:
            summary = json.load(handle)
    summary.update(
        command="python benchmarks/evidence.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        protocol={
            key: getattr(args, key)
            for key in (
                "lrs",
                "lr_step",
                "max_extensions",
                "tuning_seeds",
                "seeds",
                "arg_seeds",
                "eval_every",
                "prompts_per_step",
                "num_generations",
                "eval_size",
                "target_line",
                "ppm_steps",
                "papo_steps",
                "arg_steps",
                "horizons",
                "papo_n",
            )
        },
    )
    tables_by_part: dict[str, list[str]] = summary.setdefault("tables", {})
    for part in PARTS:
        if part in args.parts:
            tables_by_part[part] = []
            {"ppm": ppm_part, "ppm_robust": ppm_robust_part, "papo": papo_part, "arg": arg_part}[part](
                args, summary, tables_by_part[part]
            )
    # tables.md holds every part: those not run now keep the tables an earlier invocation wrote into summary.json.
    missing = [part for part in PARTS if part not in tables_by_part]
    if missing:
        print(f"tables.md: no tables yet for {', '.join(missing)} (run --parts {' '.join(missing)})", flush=True)
    tables = [table for part in PARTS for table in tables_by_part.get(part, [])]
    if PENDING:
        print(
            f"{len(PENDING)} run(s) of the next step not trained yet (later steps depend on them):\n  "
            + "\n  ".join(PENDING),
            flush=True,
        )
    with open(summary_path, "w") as handle:
        json.dump(summary, handle, indent=2, default=str)
    with open(os.path.join(args.output_dir, "tables.md"), "w") as handle:
        handle.write("\n\n".join(tables) + "\n")
    print("\n\n".join(tables), flush=True)
    return summary


if __name__ == "__main__":
    pin_kernels()  # re-executes with the pinned kernels (ppm_trl.demo.kernels)
    main()
