"""The rules a judge's settings must keep, written once: `LiteLLMJudge` checks its arguments with them, and
`JudgeArguments` (the `judge_*` fields of the training configs and of `ppm-trl prepare`) checks its fields with them
when it is built — a negative timeout, rate or budget is a ValueError naming the setting in the caller's spelling
(`timeout` for the client, `judge_timeout` for a config). Also the one rule for the judge cache directory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from ppm_trl.judge.redaction import api_base_problem
from ppm_trl.judge.transport import TRANSPORTS, check_max_response_bytes

# The LiteLLMJudge arguments a config sets (each as the field `judge_<name>`); `cache_dir` is resolved first
# (`judge_cache_dir`).
CLIENT_SETTINGS = ("model", "api_base", "max_concurrency", "max_rpm", "max_tpm", "burst_seconds", "max_cost_usd",
                   "max_total_tokens", "timeout", "num_retries", "temperature", "transport", "api_key_env", "cache_dir",
                   "max_response_bytes", "echo_nonce")
_LIMITS = ("max_rpm", "max_tpm", "max_cost_usd", "max_total_tokens")  # None: no limit


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check_judge_settings(settings: Mapping[str, Any], prefix: str = "") -> None:
    """A ValueError naming the first of `settings` (client argument names, see `CLIENT_SETTINGS`; those absent are
    not checked) that breaks its rule; the name is written `prefix + name` (`judge_timeout` for a config)."""
    def refuse(name: str, rule: str) -> None:
        raise ValueError(f"{prefix}{name} {rule}, got {settings[name]!r}")

    present = [name for name in CLIENT_SETTINGS if name in settings]
    for name in present:
        value = settings[name]
        if name == "model" and not (isinstance(value, str) and value.strip()):
            refuse(name, "must be a LiteLLM model string such as 'openai/gpt-4o-mini'")
        elif name == "max_concurrency" and not _integer(value, 1):
            refuse(name, "must be an integer >= 1")
        elif name == "timeout" and not (_number(value) and value > 0 and math.isfinite(value)):
            refuse(name, "must be a finite number > 0 of seconds")
        elif name == "num_retries" and not _integer(value, 0):
            refuse(name, "must be an integer >= 0")
        elif name == "temperature" and not (_number(value) and math.isfinite(value) and value >= 0):
            refuse(name, "must be a number >= 0")
        elif name in _LIMITS and value is not None and not (
                _number(value) and value > 0 and math.isfinite(value) and math.isfinite(1 / value)):
            refuse(name, "must be a finite number > 0 whose reciprocal is finite too (or None: unlimited)")
        elif name == "burst_seconds" and not (_number(value) and value > 0 and math.isfinite(value)):
            refuse(name, "must be a finite number > 0 of seconds")
        elif name == "echo_nonce" and not isinstance(value, bool):
            refuse(name, "must be True or False")
        elif name == "api_key_env" and value is not None and not (isinstance(value, str) and value.strip()):
            refuse(name, "must name an environment variable (or None: the provider's)")
        elif name == "transport" and value not in TRANSPORTS:
            raise ValueError(f"unknown {prefix}transport {value!r}; accepted: {sorted(TRANSPORTS)}")
        elif name == "max_response_bytes":
            try:
                check_max_response_bytes(value)
            except ValueError as error:
                raise ValueError(f"{prefix}{error}") from None
        elif name == "api_base" and value is not None:
            if not isinstance(value, str):
                refuse(name, "must be a URL string such as 'http://127.0.0.1:8000/v1'")
            problem = api_base_problem(value)
            if problem is not None:  # the URL is not shown: it may hold a secret
                raise ValueError(
                    f"{prefix}api_base is refused: it has {problem}. It must be scheme://host[:port][/path] and "
                    "nothing else — anything more can carry a credential, and api_base is written into every judge "
                    "cache entry, config(), logs and errors. Put the key in the environment (the provider's variable, "
                    "e.g. OPENAI_API_KEY, or one named by api_key_env).")


def check_unscorable_settings(max_unscorable_frac: float, unscorable_window: int, unscorable_min_rows: int = 2,
                              quarantine_after: int = 2) -> None:
    """Refuse abort and quarantine settings that would never (or always) stop a run."""
    if not _number(max_unscorable_frac) or not 0.0 < max_unscorable_frac <= 1.0:
        raise ValueError(f"judge_max_unscorable_frac must be in (0, 1], got {max_unscorable_frac!r}")
    if not _integer(unscorable_window, 1):
        raise ValueError(f"judge_unscorable_window must be an integer >= 1, got {unscorable_window!r}")
    if not _integer(unscorable_min_rows, 1):
        raise ValueError(f"judge_unscorable_min_rows must be an integer >= 1, got {unscorable_min_rows!r}")
    if not _integer(quarantine_after, 0):
        raise ValueError(f"judge_quarantine_after must be an integer >= 0 (0: never), got {quarantine_after!r}")


def judge_cache_dir(setting: str | os.PathLike | None, default_parent: str | None) -> str | None:
    """The judge cache a `cache_dir` setting means: `<default_parent>/judge_cache` when it is not set (None; no cache
    when there is no default parent either), no cache for `none` (any case), else the path given. `train`'s default
    parent is its output_dir, `prepare`'s its work dir: a rerun pays for no answer twice."""
    if setting is None:
        return None if default_parent is None else os.path.join(default_parent, "judge_cache")
    path = os.fspath(setting)
    return None if path.strip().lower() == "none" else path
