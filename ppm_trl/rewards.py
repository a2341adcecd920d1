"""Outcome and programmatic process rewards with TRL's reward-function signature.

Every function here is `f(completions, **kwargs) -> list[float | None]`, the signature `GRPOTrainer` calls with
the completions and every dataset column as a keyword list (`answer=[...]`, `env=[...]`, ...). Completions are
conversational (`[{"role": "assistant", "content": ...}]`) or plain strings.

- `accuracy_reward`: the last `\\boxed{}` against the gold `answer` with math-verify (gold first, as its
  `verify` is not symmetric). math-verify's timeouts use `signal.alarm`, which raises off the main thread, and TRL
  awaits async reward functions on a separate thread, so timeouts are switched off there.
- `format_reward`: whether a non-empty, brace-balanced `\\boxed{}` final answer is present.
- `env_outcome_reward` / `env_point_fraction`: a synthetic task's own verifier and point matcher
  (`ppm_trl.envs`), dispatched on the `env` column.

math-verify (sympy) and the env registry are imported lazily, so importing this module stays cheap.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

# `last_boxed` lives in `text` so that `envs/`, which the env rewards below dispatch to, never imports this module.
from .text import completion_text, last_boxed

_WHITESPACE = re.compile(r"\s+")


def without_whitespace(text: str) -> str:
    """Whitespace-free form used for the exact-match fast path (`"12, 21"` == `"12,21"`)."""
    return _WHITESPACE.sub("", text)


def _column(kwargs: dict[str, Any], name: str, size: int, reward: str) -> list:
    values = kwargs.get(name)
    if values is None:
        raise ValueError(f"{reward} needs the dataset column {name!r}; got columns {sorted(kwargs)}")
    if len(values) != size:
        raise ValueError(f"{reward}: column {name!r} has {len(values)} entries for {size} completions")
    return list(values)


def _math_verify_timeouts() -> tuple[int | None, int | None]:
    """(parsing_timeout, timeout_seconds): None off the main thread, where signal.alarm raises."""
    if threading.current_thread() is threading.main_thread():
        return 5, 5
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)
    logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
    return None, None


def _as_boxed(answer: str) -> str:
    return answer if ("\\boxed" in answer or "$" in answer) else "\\boxed{" + answer + "}"


def accuracy_reward(completions: list, answer: list[str] | None = None, **kwargs) -> list[float | None]:
    """1.0 when the last `\\boxed{}` equals the gold `answer`, else 0.0; None when the gold cannot be parsed.

    A box equal to the gold up to whitespace scores 1.0 without parsing (even an unparseable gold); otherwise both sides go through math-verify
    (`verify(gold, pred)`, gold first), so `\\boxed{1/2}` matches a gold `0.5`. A completion without a closed
    box scores 0.0. The synthetic envs' structured answers (matrices, target lists) are not math expressions:
    score those with `env_outcome_reward`.
    """
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    golds = _column({**kwargs, "answer": answer}, "answer", len(completions), "accuracy_reward")
    parsing_timeout, verify_timeout = _math_verify_timeouts()
    pred_config = [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
            try_extract_without_anchor=False,
        ),
        ExprExtractionConfig(),
    ]
    rewards: list[float | None] = []
    for completion, gold in zip(completions, golds):
        gold = "" if gold is None else str(gold)
        predicted = last_boxed(completion_text(completion))
        if predicted is not None and gold.strip() and without_whitespace(predicted) == without_whitespace(gold):
            rewards.append(1.0)
            continue
        gold_parsed = parse(_as_boxed(gold), parsing_timeout=parsing_timeout) if gold.strip() else []
        if not gold_parsed:
            rewards.append(None)
            continue
        if predicted is None or not predicted.strip():
            rewards.append(0.0)
            continue
        pred_parsed = parse(
            "\\boxed{" + predicted + "}", extraction_config=pred_config, extraction_mode="first_match",
            parsing_timeout=parsing_timeout,
        )
        rewards.append(float(bool(pred_parsed) and verify(gold_parsed, pred_parsed, timeout_seconds=verify_timeout)))
    return rewards


def format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 if the completion ends its reasoning with a non-empty, brace-balanced `\\boxed{...}`, else 0.0."""
    rewards = []
    for completion in completions:
        boxed = last_boxed(completion_text(completion))
        rewards.append(1.0 if boxed is not None and boxed.strip() else 0.0)
    return rewards


def _rows(completions: list, kwargs: dict[str, Any], reward: str) -> list[dict[str, Any]]:
    """Per-completion dataset rows rebuilt from TRL's column-wise keyword lists."""
    size = len(completions)
    _column(kwargs, "env", size, reward)
    columns = {k: v for k, v in kwargs.items() if isinstance(v, (list, tuple)) and len(v) == size}
    return [{k: v[i] for k, v in columns.items()} for i in range(size)]


def env_outcome_reward(completions: list, **kwargs) -> list[float]:
    """The synthetic task's verifier (`SyntheticEnv.verify`) for each row's `env`: 1.0 solved, 0.0 not."""
    from ppm_trl.envs import get_env

    rows = _rows(completions, kwargs, "env_outcome_reward")
    return [
        1.0 if get_env(row["env"]).verify(row, completion_text(completion)) else 0.0
        for completion, row in zip(completions, rows)
    ]


def env_point_fraction(completions: list, **kwargs) -> list[float]:
    """Fraction of the row's reasoning points the full completion states itself (programmatic process score).

    Counted before the graph's shortcut closure on purpose: PAPO scores correct responses only, and with the
    closure every correct response would score 1 (the goal obsoletes everything), leaving no process signal.
    """
    from ppm_trl.envs import get_env

    rows = _rows(completions, kwargs, "env_point_fraction")
    rewards = []
    for index, (completion, row) in enumerate(zip(completions, rows)):
        points = row.get("reasoning_points")
        if not points:
            raise ValueError(f"env_point_fraction: row {index} has no 'reasoning_points' (got {points!r})")
        reached = get_env(row["env"]).match_points(row, completion_text(completion))
        rewards.append(len(reached) / len(points))
    return rewards
