"""What the methods' configurations share: whole groups in TRL's generation batch, the judge's settings, the checks.

Each method's config is a `GRPOConfig` subclass in its folder, every paper knob a field (also a YAML key and a
`--flag` of `ppm-trl train`, TRL's `TrlParser`): `PPMConfig` (`ppm_trl/ppm/ppm_config.py`), `PAPOConfig`
(`ppm_trl/papo/papo_config.py`), `ARGConfig` (`ppm_trl/arg/arg_config.py`), the composed ones
(`ppm_trl/composed.py`); they keep their names here too. Where a paper's training defaults differ from TRL's, the
paper's value is the default there and the field says so in its help text.
"""

from __future__ import annotations

import importlib
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


def refuse_normalize_then_sum(config, method: str, why: str) -> None:
    if config.multi_objective_aggregation == "normalize_then_sum":
        raise ValueError(f"{method} does not support multi_objective_aggregation='normalize_then_sum': {why}. "
                         "Use the default 'sum_then_normalize'.")


@dataclass
class JudgeArguments:
    """LiteLLM judge settings shared by PPM (point grading) and PAPO (rubric scoring).

    API keys are read from the environment by LiteLLM and are never config fields, so they never reach a saved
    `training_args.bin`, a model card or a log.
    """

    judge_model: str = field(
        default="gemini/gemini-2.5-flash-lite",
        metadata={"help": "Any LiteLLM model string, e.g. `gemini/...`, `openai/...`, `hosted_vllm/...`."},
    )
    judge_api_base: str | None = field(
        default=None, metadata={"help": "Base URL of an OpenAI-compatible server (local vLLM/SGLang)."}
    )
    judge_max_concurrency: int = field(
        default=64, metadata={"help": "Judge requests in flight at once, for the whole run: each of the N training "
                              "processes takes 1/N (at least 1)."})
    judge_max_rpm: float | None = field(
        default=None,
        metadata={"help": "The run's judge requests per minute at most (a hosted judge's quota), split evenly over the "
                  "training processes; a server's Retry-After / x-ratelimit-reset pauses requests too. None: no limit."},
    )
    judge_max_tpm: float | None = field(
        default=None,
        metadata={"help": "The run's judge tokens per minute at most (prompt + answer), split like judge_max_rpm; "
                  "tokens are estimated before a request and corrected by its usage. None: no limit."},
    )
    judge_burst_seconds: float = field(
        default=1.0,
        metadata={"help": "Seconds of the steady judge_max_rpm / judge_max_tpm rate that may go out at once."},
    )
    judge_max_cost_usd: float | None = field(
        default=None,
        metadata={"help": "Budget: when the judge has cost this much (summed over processes, LiteLLM's prices), "
                  "training stops after the step, saving a checkpoint when saving is on. Needs a priced model."},
    )
    judge_max_total_tokens: int | None = field(
        default=None,
        metadata={"help": "Budget in judge tokens (prompt + answer, summed over processes): training stops after the "
                  "step that reaches it, saving a checkpoint when saving is on."},
    )
    judge_timeout: float = field(default=60.0, metadata={"help": "Seconds before a judge request is retried."})
    judge_num_retries: int = field(default=4, metadata={"help": "Retries on 429/5xx/timeouts (exponential backoff)."})
    judge_temperature: float = field(default=0.0, metadata={"help": "Judge sampling temperature."})
    judge_transport: str = field(
        default="litellm",
        metadata={"help": "`litellm` (any provider) or `openai_http` (direct HTTP to an OpenAI-compatible "
                  "`judge_api_base`, ~5x less client CPU per request; see BENCHMARKS.md)."},
    )
    judge_api_key_env: str | None = field(
        default=None,
        metadata={"help": "Name of the environment variable holding the judge's API key (never the key). Default: "
                  "the provider's (`OPENAI_API_KEY` for `openai/...`, `HOSTED_VLLM_API_KEY` for `hosted_vllm/...`). "
                  "A local OpenAI-compatible server that needs no key needs none set, with either transport."},
    )
    judge_probe: bool = field(
        default=True,
        metadata={"help": "Send one tiny request (not cached, not counted) when the trainer is built: a refused or "
                  "missing key, an unknown model or URL, or no server at `judge_api_base` stops with a clear "
                  "error before training; a transient error (429/5xx/timeout) only warns."},
    )
    judge_max_unscorable_frac: float = field(
        default=1.0,
        metadata={"help": "Stop training when this fraction (in (0, 1]) of the judge's requests over the last "
                  "`judge_unscorable_window` steps with judge requests were unscorable. 1.0: stop when every "
                  "request of the window failed (a judge that cannot judge, never a silent zero-reward run)."},
    )
    judge_unscorable_window: int = field(
        default=1, metadata={"help": "Steps (with judge requests) over which `judge_max_unscorable_frac` is measured."}
    )
    judge_unscorable_min_rows: int = field(
        default=2,
        metadata={"help": "Stop only when the unscorable requests of the current run of failing steps come from at "
                  "least this many rows (a row counts once per step it fails in): a broken judge fails every row "
                  "(a full batch reaches this at once), while a few rows the judge cannot score do not stop the "
                  "run and are quarantined instead (`judge_quarantine_after`)."},
    )
    judge_quarantine_after: int = field(
        default=2,
        metadata={"help": "Quarantine a row after this many steps in which every judge request of it was "
                  "unscorable while the judge scored other rows: it is listed in `<output_dir>/quarantine.jsonl` "
                  "and its later requests are skipped (NaN score, zero advantage, counted in `judge/quarantined`). "
                  "0: never."},
    )
    judge_cache_dir: str | None = field(
        default=None,
        metadata={"help": "On-disk cache of judge answers; default `<output_dir>/judge_cache`; `none`: no cache. "
                  "A directory that cannot be created or written is an error before training."},
    )
    judge_max_response_bytes: int = field(
        default=4 * 2**20,
        metadata={"help": "Largest judge answer body (bytes, decoded) an attempt accepts; a larger one fails the "
                  "attempt. `openai_http` stops reading at the cap (a gzip bomb costs at most this); `litellm` can "
                  "only refuse the text it returns."},
    )
    judge_echo_nonce: bool = field(
        default=False,
        metadata={"help": "Ask the judge to start its answer with a per-request nonce and refuse (retry, never cache) "
                  "an answer without it: catches a server that returns another request's answer. Needs a judge "
                  "that follows that instruction."},
    )

    def judge_kwargs(self, output_dir: str) -> dict:
        import os

        return dict(
            model=self.judge_model,
            api_base=self.judge_api_base,
            max_concurrency=self.judge_max_concurrency,
            timeout=self.judge_timeout,
            num_retries=self.judge_num_retries,
            temperature=self.judge_temperature,
            transport=self.judge_transport,
            api_key_env=self.judge_api_key_env,
            max_response_bytes=self.judge_max_response_bytes,
            echo_nonce=self.judge_echo_nonce,
            cache_dir=None if str(self.judge_cache_dir or "").lower() == "none"
            else self.judge_cache_dir or os.path.join(output_dir, "judge_cache"),
            max_rpm=self.judge_max_rpm,
            max_tpm=self.judge_max_tpm,
            burst_seconds=self.judge_burst_seconds,
            max_cost_usd=self.judge_max_cost_usd,
            max_total_tokens=self.judge_max_total_tokens,
        )


# The method configs and their accepted values, under the names this module has always exported (imported on first
# use: the method folders import this module, not the other way round).
_MOVED = {
    **dict.fromkeys(("PPMConfig",), "ppm_trl.ppm.ppm_config"),
    **dict.fromkeys(("GRANULARITIES", "PROGRESS_MODES"), "ppm_trl.ppm.ppm_estimators"),
    **dict.fromkeys(("SEGMENTATIONS",), "ppm_trl.ppm.segmentation"),
    **dict.fromkeys(("PAPOConfig", "RUBRICS"), "ppm_trl.papo.papo_config"),
    **dict.fromkeys(("ARGConfig", "ARG_MODES", "ARG_MAX_ACCEPTED"), "ppm_trl.arg.arg_config"),
    **dict.fromkeys(("PPMARGConfig", "PAPOARGConfig"), "ppm_trl.composed"),
}


def __getattr__(name: str):
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
