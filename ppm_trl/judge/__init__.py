"""LLM-as-a-judge through LiteLLM: client, paper prompts (PPM App. D, PAPO A.3), strict parsers, escaping.

`import ppm_trl.judge` imports neither LiteLLM nor transformers: LiteLLM is imported when the first request is
sent, transformers when `JudgeStatsCallback` is first used.
"""

from __future__ import annotations

from ppm_trl.judge.arguments import JudgeArguments, build_judge
from ppm_trl.judge.cache import ResponseCache, request_fingerprint, request_key
from ppm_trl.judge.client import LiteLLMJudge
from ppm_trl.judge.errors import JudgeConfigurationError
from ppm_trl.judge.escaping import escape_papo_solution, escape_process_chunk, escape_rollout
from ppm_trl.judge.parsing import (
    answer_in_text,
    final_answer_of,
    parse_boxed_score,
    parse_graph,
    parse_numbered_grades,
    parse_point_grades,
    parse_process_verdict,
    parse_rubric,
)
from ppm_trl.judge.prompts import PAPO_TIERS, build_messages, format_rubric
from ppm_trl.judge.redaction import redact
from ppm_trl.judge.stats import JudgeStats
from ppm_trl.judge.tasks import JudgeFailure

__all__ = [
    "PAPO_TIERS",
    "JudgeConfigurationError",
    "JudgeArguments",
    "JudgeFailure",
    "JudgeStats",
    "JudgeStatsCallback",
    "LiteLLMJudge",
    "ResponseCache",
    "answer_in_text",
    "build_judge",
    "build_messages",
    "escape_papo_solution",
    "escape_process_chunk",
    "escape_rollout",
    "final_answer_of",
    "format_rubric",
    "parse_boxed_score",
    "parse_graph",
    "parse_numbered_grades",
    "parse_point_grades",
    "parse_process_verdict",
    "parse_rubric",
    "redact",
    "request_fingerprint",
    "request_key",
]


def __getattr__(name: str):
    if name == "JudgeStatsCallback":  # imports transformers
        from ppm_trl.judge.callback import JudgeStatsCallback

        return JudgeStatsCallback
    raise AttributeError(f"module 'ppm_trl.judge' has no attribute {name!r}")
