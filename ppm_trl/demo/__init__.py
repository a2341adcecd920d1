"""`make demo`: segment-level PPM vs plain GRPO on a long-horizon task, on CPU, in minutes — the same numbers on
every machine that builds the same warm start.

1. Build the tiny model offline and warm-start it by a fixed number of SFT steps on `multi_add` references, one
   thread, deterministic algorithms (`warmstart`, cached with its weights digest: the fingerprint it prints).
2. Profile the warm start per horizon (all-correct, per-line accuracy) and pick the cliff by a stated rule
   (`horizons.choose_horizons`: base all-correct low but non-zero, every line learnable, monotone fall-off).
3. Train `PPMGRPOTrainer` (segment-level, one segment per line) and plain `GRPOTrainer` (sparse outcome) from the
   same warm start with the same samples, for several seeds, each trainer at its own tuned learning rate, two runs
   at a time in worker processes (`runs.train_variants`).
4. Print before/after per seed and the mean, write `success_vs_samples.png`, `results.json` and the PPM checkpoint
   (`ppm_model/`, loadable with `from_pretrained`) under `--output-dir` (`pipeline.main`, `python -m ppm_trl.demo`).

The package serves the demo and the benchmarks (`benchmarks/`) only; nothing in the library imports it.
"""

from .horizons import HorizonRule, choose_horizons, format_profile, profile_warm_start
from .pipeline import DEMO_LEARNING_RATES, DemoArguments, main, parse_args
from .runs import (
           VARIANT_LABELS,
           VARIANTS,
           RunSpec,
           build_variant_trainer,
           plot_histories,
           train_variant,
           train_variants,
)

__all__ = ["DEMO_LEARNING_RATES", "VARIANTS", "VARIANT_LABELS", "DemoArguments", "HorizonRule", "RunSpec",
           "build_variant_trainer", "choose_horizons", "format_profile", "main", "parse_args", "plot_histories",
           "profile_warm_start", "train_variant", "train_variants"]
