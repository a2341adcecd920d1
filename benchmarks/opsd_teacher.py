"""What OPSD's fixed teacher writes: the evidence warm start given the reference as privileged context (issue 40).

    python benchmarks/opsd_teacher.py            # benchmarks/results/opsd_teacher.json; ~5 min on one core

OPSD (`--method opsd`) trains the policy toward the starting policy's next-token distribution when that policy reads
`opsd_teacher_template` — the problem and the reference solution — instead of the problem alone. On the evidence task
every OPSD tuning run collapsed to answer-only boxes. This samples the teacher itself, on the same tuning prompts and
budget, beside the student's own prompt: if the teacher's completions are already answer-only or malformed, the
collapse is what eq. 111 asks for in this setting (a tiny model that never saw the template), not a training bug.
Both at T = 1 (what the JSD matches) and greedy; the first 16 completions of each are kept.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # the evidence runs' setting; must precede torch's import

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

from common import RESULTS  # noqa: E402
from evidence_protocol import eval_set  # noqa: E402

from ppm_trl.demo.kernels import pin_kernels  # noqa: E402
from ppm_trl.demo.warmstart import (  # noqa: E402
    WarmStartSettings,
    completion_budget,
    evaluate_policy,
    load_policy,
    read_manifest,
    warm_start,
)
from ppm_trl.opsd.opsd_config import TEACHER_TEMPLATE  # noqa: E402
from ppm_trl.text import problem_text  # noqa: E402

ANSWER_FIRST = re.compile(r"\s*\\boxed\{")  # the completion opens with its answer: no line worked out before it


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="multi_add")
    parser.add_argument("--n", type=int, default=8, help="The horizon the OPSD tuning runs used.")
    parser.add_argument("--size", type=int, default=256, help="Tuning prompts (as the evidence runs evaluate).")
    parser.add_argument("--output", default=os.path.join(RESULTS, "opsd_teacher.json"))
    return parser.parse_args(argv)


def teacher_rows(dataset):
    """The same rows with the teacher's user turn (what `OPSDTrainer` renders) as the prompt."""
    def as_teacher(row):
        text = TEACHER_TEMPLATE.format(problem=problem_text(row), reference=row["reference"])
        return {"prompt": [{"role": "user", "content": text}]}

    return dataset.map(as_teacher)


def describe(metrics: dict) -> dict:
    kept = metrics.get("completions", [])
    answer_first = sum(bool(ANSWER_FIRST.match(c["completion"])) for c in kept)
    return {"all_correct": metrics["all_correct"], "per_subproblem": metrics["per_subproblem"],
            "answer_first_of_kept": answer_first / len(kept) if kept else None, "kept": kept}


def main(argv=None) -> int:
    args = parse_args(argv)
    path = warm_start(WarmStartSettings.for_env(args.env), progress=False)
    model, tokenizer = load_policy(path)
    student = eval_set(args.env, args.n, "tune", args.size)
    budget = completion_budget(args.env, args.n)
    report = {"env": args.env, "n": args.n, "prompts": len(student), "max_new_tokens": budget,
              "warm_start": read_manifest(path)["weights_digest"], "template": TEACHER_TEMPLATE}
    for name, rows in (("student", student), ("teacher", teacher_rows(student))):
        for mode, temperature in (("sampled", 1.0), ("greedy", 0.0)):
            metrics = evaluate_policy(model, tokenizer, rows, budget, temperature=temperature, seed=0,
                                      keep_completions=16)
            report[f"{name}_{mode}"] = described = describe(metrics)
            print(f"{name} {mode}: all-correct {described['all_correct']:.3f}, per-sub-problem "
                  f"{described['per_subproblem']:.3f}, answer first in {described['answer_first_of_kept']:.3f} of "
                  "the 16 kept", flush=True)
    with open(args.output, "w") as handle:
        json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    pin_kernels()  # re-executes with the pinned kernels (ppm_trl.demo.kernels)
    sys.exit(main())
