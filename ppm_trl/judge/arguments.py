"""The judge's settings, defined once: `JudgeArguments`, the `judge_*` fields of `PPMConfig` and `PAPOConfig` (each a
YAML key and a flag of `ppm-trl train`), checked when built; `build_judge`, the one way from them to a
`LiteLLMJudge` (for `train`, `prepare`, `estimate` and Python users); and `add_judge_arguments`, which makes
`ppm-trl prepare`'s judge flags from the same fields (with the older spellings `prepare` had as aliases).

    judge = build_judge(PPMConfig(output_dir="out", judge_model="openai/gpt-4o-mini"))  # cache: out/judge_cache
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from ppm_trl.judge.client import LiteLLMJudge
from ppm_trl.judge.settings import CLIENT_SETTINGS, check_judge_settings, check_unscorable_settings, judge_cache_dir

# Fields that are training's alone (a command that does not train has no flag for them).
TRAINING_ONLY = ("judge_max_unscorable_frac", "judge_unscorable_window", "judge_unscorable_min_rows",
                 "judge_quarantine_after")
# `ppm-trl prepare` spelled these judge flags without `judge-`: they keep working, and are the names it shows.
PREPARE_ALIASES = {
    "judge_api_base": "--api-base", "judge_api_key_env": "--api-key-env", "judge_max_concurrency": "--max-concurrency",
    "judge_timeout": "--timeout", "judge_num_retries": "--num-retries", "judge_temperature": "--temperature",
    "judge_transport": "--transport", "judge_cache_dir": "--cache-dir", "judge_max_rpm": "--max-rpm",
    "judge_max_tpm": "--max-tpm", "judge_max_cost_usd": "--max-cost-usd", "judge_max_total_tokens": "--max-total-tokens",
    "judge_max_response_bytes": "--max-response-bytes", "judge_echo_nonce": "--echo-nonce",
}
REQUIRED = object()  # `add_judge_arguments(defaults={name: REQUIRED})`: the flag must be given


@dataclass
class JudgeArguments:
    """LiteLLM judge settings shared by PPM (point grading) and PAPO (rubric scoring), and by `ppm-trl prepare`.

    Checked when built (`settings.py`: a negative timeout, rate or budget is a ValueError naming the field); as a
    base of a training config it checks before the config's own `__post_init__` goes on. API keys are read from the
    environment by LiteLLM and are never config fields, so they never reach a saved `training_args.bin`, a model
    card or a log.
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

    def __post_init__(self):
        check_judge_arguments(self)
        parent = super()
        if hasattr(parent, "__post_init__"):  # a training config: its other bases check theirs
            parent.__post_init__()

    def judge_kwargs(self, output_dir: str | None = None) -> dict[str, Any]:
        """The `LiteLLMJudge` arguments these settings give; the cache in `<output_dir>/judge_cache` unless
        `judge_cache_dir` says otherwise (`none`: no cache)."""
        kwargs = {name: getattr(self, f"judge_{name}") for name in CLIENT_SETTINGS}
        kwargs["cache_dir"] = judge_cache_dir(self.judge_cache_dir, output_dir)
        return kwargs


def check_judge_arguments(arguments: JudgeArguments) -> None:
    """A ValueError naming the first `judge_*` field of `arguments` that breaks its rule (`settings.py`)."""
    check_judge_settings({name: getattr(arguments, f"judge_{name}") for name in CLIENT_SETTINGS}, prefix="judge_")
    check_unscorable_settings(arguments.judge_max_unscorable_frac, arguments.judge_unscorable_window,
                              arguments.judge_unscorable_min_rows, arguments.judge_quarantine_after)
    if not isinstance(arguments.judge_probe, bool):
        raise ValueError(f"judge_probe must be True or False, got {arguments.judge_probe!r}")


def build_judge(arguments: JudgeArguments, output_dir: str | None = None, **overrides: Any) -> LiteLLMJudge:
    """The `LiteLLMJudge` that `arguments` describe, its fields checked again (a config changed after it was built
    is checked before a model loads). Its default cache is `<output_dir>/judge_cache`, `output_dir` defaulting to the
    training config's own (`arguments.output_dir`); `overrides` replace client arguments (`ppm-trl estimate
    --calibrate` turns the cache and the budget off: `cache_dir=None, max_cost_usd=None`)."""
    check_judge_arguments(arguments)
    if output_dir is None:
        output_dir = getattr(arguments, "output_dir", None)  # TrainingArguments' field, when `arguments` is a config
    return LiteLLMJudge(**{**arguments.judge_kwargs(output_dir), **overrides})


def _flag_type(hint: Any) -> type:
    """The argparse type of a field: `float | None` → float."""
    kinds = [kind for kind in typing.get_args(hint) or (hint,) if kind is not type(None)]
    return kinds[0]


def add_judge_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, aliases: dict[str, str] | None = None,
                        defaults: dict[str, Any] | None = None, help: dict[str, str] | None = None,
                        exclude: tuple[str, ...] = TRAINING_ONLY) -> None:
    """Add a flag for each field of `JudgeArguments` (but `exclude`) to `parser`: `--judge-timeout` for
    `judge_timeout`, the field's type, default and help, and `aliases[name]` as another name for it (shown first).
    A bool field is `--flag` / `--no-flag` (`argparse.BooleanOptionalAction`). `defaults` and `help` replace a
    field's; `REQUIRED` makes the flag required. `judge_arguments(namespace)` reads the parsed flags back."""
    hints = typing.get_type_hints(JudgeArguments)
    for spec in dataclasses.fields(JudgeArguments):
        if spec.name in exclude:
            continue
        names = [*([aliases[spec.name]] if aliases and spec.name in aliases else []), f"--{spec.name.replace('_', '-')}"]
        default = (defaults or {}).get(spec.name, spec.default)
        text = (help or {}).get(spec.name, spec.metadata.get("help", "")).replace("%", "%%")
        kind = _flag_type(hints[spec.name])
        options: dict[str, Any] = {"dest": spec.name, "help": text}
        if default is REQUIRED:
            options["required"] = True
        else:
            options["default"] = default
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = kind
            options["metavar"] = spec.name.removeprefix("judge_").upper()
        parser.add_argument(*names, **options)


def judge_arguments(namespace: argparse.Namespace) -> JudgeArguments:
    """The `JudgeArguments` of parsed flags (`add_judge_arguments`); fields without a flag keep their defaults.
    Checked as it is built: a ValueError names the field."""
    return JudgeArguments(**{spec.name: getattr(namespace, spec.name) for spec in dataclasses.fields(JudgeArguments)
                             if hasattr(namespace, spec.name)})


def flag_of(name: str, aliases: dict[str, str] | None = None) -> str:
    """The flag `add_judge_arguments` shows for field `name`."""
    return (aliases or {}).get(name) or f"--{name.replace('_', '-')}"
