"""`make demo`: segment-level PPM vs plain GRPO on a long-horizon task, on CPU, in minutes.

1. Build the tiny model offline and warm-start it by SFT on `multi_add` references (`warmstart`, cached).
2. Measure the warm start's all-correct rate per horizon and pick the cliff: the smallest n where it is ≤ 3%
   (sparse outcome rewards are then rare: about one success per batch, PPM paper §5.1, Theorem 5.1).
3. Train `PPMGRPOTrainer` (segment-level) and plain `GRPOTrainer` (sparse outcome) from the same warm start
   with the same samples and seed, each at its own tuned learning rate; evaluate sampled success on held-out
   prompts as they train (`runs.train_variant`).
4. Print before/after, write `success_vs_samples.png`, `results.json` and the PPM checkpoint (`ppm_model/`,
   loadable with `from_pretrained`) under `--output-dir` (`pipeline.main`, `python -m ppm_trl.demo`).

The package serves the demo and the benchmarks (`benchmarks/`) only; nothing in the library imports it.
"""

from .pipeline import DEMO_LEARNING_RATES, DemoArguments, main, parse_args
from .runs import VARIANT_LABELS, VARIANTS, RunSpec, build_trainer, find_cliff, plot_histories, train_variant

__all__ = ["DEMO_LEARNING_RATES", "VARIANTS", "VARIANT_LABELS", "DemoArguments", "RunSpec", "build_trainer",
           "find_cliff", "main", "parse_args", "plot_histories", "train_variant"]
