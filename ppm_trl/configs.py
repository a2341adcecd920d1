"""What the methods' configurations share: whole groups in TRL's generation batch, the judge's settings, the checks.

Each method's config is a `GRPOConfig` subclass in its folder, every paper knob a field (also a YAML key and a
`--flag` of `ppm-trl train`, TRL's `TrlParser`): `PPMConfig` (`ppm_trl/ppm/ppm_config.py`), `PAPOConfig`
(`ppm_trl/papo/papo_config.py`), `ARGConfig` (`ppm_trl/arg/arg_config.py`), the composed ones
(`ppm_trl/composed.py`); they keep their names here too. Where a paper's training defaults differ from TRL's, the
paper's value is the default there and the field says so in its help text.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

# The scorers PPM and PAPO both offer (each config accepts its own table's keys: PROGRESS_SCORERS, PROCESS_SCORERS).
SCORERS = ("programmatic", "judge")

logger = logging.getLogger(__name__)

# The settings that decide TRL's generation batch.
BATCH_KEYS = ("num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
              "generation_batch_size", "steps_per_generation")
# Set by none of these, gradient_accumulation_steps is derived (`fit_generation_batch`).
BATCH_CHOICES = ("gradient_accumulation_steps", "generation_batch_size", "steps_per_generation")


def fit_generation_batch(given: dict, defaults: dict, num_processes: int = 1,
                         flags: bool = False) -> tuple[dict, str | None]:
    """(settings to default, a line saying so) that make TRL's generation batch hold whole groups of
    `num_generations` completions; a ValueError naming the settings when the user's own settings cannot.

    The one rule for both the configs (`__post_init__`) and `ppm-trl train` (which prints the line). TRL's
    generation batch is per_device_train_batch_size × processes × steps_per_generation (default: the gradient
    accumulation steps) or `generation_batch_size`, and must be a multiple of num_generations: PPM's 16 against
    TRL's batch of 8 fails. When the user set none of gradient_accumulation_steps, generation_batch_size and
    steps_per_generation, gradient_accumulation_steps is derived: each optimizer step trains on whole groups,
    on-policy, with the per-device (memory) batch unchanged. `given` holds the user's values (None: not given;
    strings are read as integers); `flags`: the error spells the fix as `ppm-trl train` flags, else as Python
    keyword arguments.
    """
    def value(key):
        return int(given[key]) if given.get(key) is not None else defaults.get(key)

    def setting(name, number=None):
        if flags:
            return f"--{name}" + ("" if number is None else f" {number}")
        return name if number is None else f"{name}={number}"

    generations, per_device = value("num_generations"), value("per_device_train_batch_size")
    if not generations or generations < 1 or not per_device or per_device < 1:
        return {}, None  # the configs' own checks name these
    global_batch = per_device * num_processes
    processes = f"{num_processes} process{'es' * (num_processes != 1)}"
    if given.get("generation_batch_size") is not None:
        batch, how, flag = value("generation_batch_size"), "generation_batch_size", "generation_batch_size"
    elif given.get("steps_per_generation") is not None:
        steps = value("steps_per_generation")
        batch, flag = global_batch * steps, "steps_per_generation"
        how = f"per_device_train_batch_size={per_device} × {processes} × steps_per_generation={steps}"
    else:
        steps = value("gradient_accumulation_steps") or 1
        batch, flag = global_batch * steps, "gradient_accumulation_steps"
        how = f"per_device_train_batch_size={per_device} × {processes} × gradient_accumulation_steps={steps}"
    if batch % generations == 0:
        return {}, None
    fitting_steps = generations // math.gcd(global_batch, generations)
    if all(given.get(k) is None for k in BATCH_CHOICES):
        total = global_batch * fitting_steps
        return {"gradient_accumulation_steps": fitting_steps}, (
            f"num_generations={generations} completions per prompt do not fit a batch of per_device_train_batch_size="
            f"{per_device} × {processes}, so gradient_accumulation_steps={fitting_steps}: each optimizer step trains "
            f"on {total} completions ({total // generations} prompt(s) × {generations}); set "
            "gradient_accumulation_steps, per_device_train_batch_size or num_generations to choose otherwise")
    fix = (setting("generation_batch_size", global_batch * fitting_steps) if flag == "generation_batch_size"
           else setting(flag, fitting_steps))
    raise ValueError(f"the generation batch ({how} = {batch}) must be a multiple of num_generations={generations}, "
                     f"so that each prompt's {generations} completions are scored together; set {fix}, or "
                     f"{setting('per_device_train_batch_size', generations)}, or a {setting('num_generations')} that "
                     f"divides {batch}")


@dataclass
class WholeGroupBatches:
    """`gradient_accumulation_steps` unset (None) by default, so that a config can tell "not given" from 1: then it
    is derived so that TRL's generation batch holds whole groups (`fit_generation_batch`: PPM's 16 generations with
    TRL's per-device batch of 8 give 2), else TRL's default 1. A setting the user gave that cannot hold whole groups
    is a ValueError naming the settings. Put it before `GRPOConfig` in the bases: its `__post_init__` runs first."""

    gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={"help": "Optimizer steps' worth of batches accumulated before an update. Default: 1, or — when "
                  "none of gradient_accumulation_steps, generation_batch_size and steps_per_generation is set and "
                  "num_generations does not divide the batch — the smallest count whose batch holds whole groups "
                  "(PPM's 16 generations with a per-device batch of 8: 2)."},
    )

    def __post_init__(self):
        self._fit_whole_groups()
        super().__post_init__()

    def _fit_whole_groups(self) -> None:
        given = {key: getattr(self, key) for key in BATCH_KEYS}
        derived, note = fit_generation_batch(given, {"gradient_accumulation_steps": 1},
                                             int(os.environ.get("WORLD_SIZE", "1")))
        self.gradient_accumulation_steps = derived.get("gradient_accumulation_steps",
                                                       self.gradient_accumulation_steps or 1)
        if note and os.environ.get("RANK", "0") == "0":
            logger.warning("ppm_trl: %s", note)


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; accepted values: {', '.join(map(str, choices))}")


def refuse_normalize_then_sum(config, method: str, why: str, alternative: str = "") -> None:
    if config.multi_objective_aggregation == "normalize_then_sum":
        raise ValueError(f"{method} does not support multi_objective_aggregation='normalize_then_sum' {why}. Use "
                         + (f"{alternative}, or " if alternative else "") + "the default 'sum_then_normalize'.")
