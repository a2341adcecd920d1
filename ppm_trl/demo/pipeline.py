"""`make demo` / `python -m ppm_trl.demo`: segment-level PPM vs plain GRPO on `multi_add`, the four steps of
`ppm_trl.demo` from the command line (`DemoArguments`, parsed by TRL's `TrlParser`)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

from .runs import VARIANT_LABELS, RunSpec, find_cliff, plot_histories, train_variant
from .warmstart import WarmStartSettings, warm_start

# Each trainer at its own best learning rate of the grid at the cliff (horizon_scaling, seed 0): an lr tuned for
# one estimator and reused for the other would fake (or hide) a gap. Sparse GRPO collapses at 3e-4.
DEMO_LEARNING_RATES = {"segment": 3e-4, "sparse": 1e-4}


@dataclass
class DemoArguments:
    """`make demo` / `python -m ppm_trl.demo`: each field is a `--flag` (dashes or underscores) and a YAML key
    (`--config demo.yaml`), parsed by TRL's `TrlParser` like `ppm-trl train`."""

    output_dir: str = field(default="outputs/demo", metadata={"help": "Where results, plot and checkpoint go."})
    # No "%" in help texts: argparse formats them with `%` (a "3%" made `--help` crash).
    n: int | None = field(default=None,
                          metadata={"help": "Horizon; default: the warm start's cliff (all-correct ≤ 0.03)."})
    horizons: list[int] = field(default_factory=lambda: [2, 3, 4, 5, 6, 7, 8],
                                metadata={"help": "Horizons searched for the cliff."})
    steps: int = field(default=60, metadata={"help": "RL steps per trainer (64 samples each)."})
    learning_rate: float | None = field(
        default=None, metadata={"help": "One learning rate for both trainers (default: each its tuned one)."})
    eval_every: int = field(default=15, metadata={"help": "Evaluate every this many steps."})
    eval_size: int = field(default=128, metadata={"help": "Held-out prompts per evaluation."})
    seed: int = field(default=0, metadata={"help": "Seed of the warm start and the RL runs."})
    sft_steps: int | None = field(default=None, metadata={"help": "Override the warm start's SFT steps."})
    cache_dir: str | None = field(default=None, metadata={"help": "Warm-start cache root (default ~/.cache/ppm_trl)."})
    quick: bool = field(default=False, metadata={"help": "Smoke size: tiny warm start, n=2, 2 steps (tests)."})

    def __post_init__(self):
        for name in ("steps", "eval_every", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.n is not None and self.n < 1:
            raise ValueError(f"--n must be >= 1, got {self.n}")


def parse_args(argv=None) -> DemoArguments:
    from trl import TrlParser

    (args,) = TrlParser((DemoArguments,), prog="python -m ppm_trl.demo").parse_args_and_config(argv)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from ..envs import make_dataset

    os.makedirs(args.output_dir, exist_ok=True)
    settings = WarmStartSettings(seed=args.seed)
    if args.quick:
        settings = WarmStartSettings(seed=args.seed, horizons=(1, 2), num_examples=64, max_steps=2, batch_size=8,
                                     hidden_size=32, num_hidden_layers=1, target_per_subproblem=None)
        args.n, args.steps, args.eval_every, args.eval_size = 2, 2, 1, 8
    if args.sft_steps is not None:
        settings.max_steps = args.sft_steps
    t0 = time.time()
    print(f"[1/4] warm start: SFT of the tiny model on multi_add references (cached) {asdict(settings)}", flush=True)
    model_path = warm_start(settings, cache_root=args.cache_dir)
    print(f"      checkpoint: {model_path} ({time.time() - t0:.0f}s)", flush=True)

    print("[2/4] warm-start success by horizon (sampled, T=1)", flush=True)
    if args.n is None:
        args.n, base_rates = find_cliff(model_path, "multi_add", args.horizons, args.eval_size)
    else:
        base_rates = {}
    print(f"      training at n={args.n}", flush=True)

    eval_dataset = make_dataset("multi_add", args.n, args.eval_size, seed=90_000 + args.n)
    results = []
    ppm_dir = os.path.join(args.output_dir, "ppm_model")
    learning_rates = {v: args.learning_rate or lr for v, lr in DEMO_LEARNING_RATES.items()}
    print(f"[3/4] RL: {args.steps} steps × 64 samples per trainer, learning rates {learning_rates}", flush=True)
    for variant in ("segment", "sparse"):
        spec = RunSpec(variant=variant, n=args.n, learning_rate=learning_rates[variant], max_steps=args.steps,
                       eval_every=args.eval_every, seed=args.seed)
        results.append(train_variant(model_path, spec, eval_dataset, os.path.join(args.output_dir, variant),
                                     save_dir=ppm_dir if variant == "segment" else None))

    print("[4/4] results (held-out prompts, sampled at T=1)", flush=True)
    for result in results:
        first, last = result["history"][0], result["history"][-1]
        print(f"  {VARIANT_LABELS[result['spec']['variant']]:<24} all-correct {first['all_correct']:.3f} → "
              f"{last['all_correct']:.3f}   per-sub-problem {first['per_subproblem']:.3f} → "
              f"{last['per_subproblem']:.3f}   ({last['samples']} samples, {result['train_seconds']:.0f}s)")
    plot_path = os.path.join(args.output_dir, "success_vs_samples.png")
    plot_histories(results, plot_path, f"multi_add, n={args.n}: segment-level PPM vs sparse GRPO")
    summary = {"n": args.n, "warm_start": model_path, "base_rates": base_rates, "runs": results,
               "plot": plot_path, "ppm_model": ppm_dir, "wall_seconds": time.time() - t0}
    with open(os.path.join(args.output_dir, "results.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    print(f"  plot: {plot_path}\n  PPM checkpoint (from_pretrained): {ppm_dir}\n  total {time.time() - t0:.0f}s")
    return summary
