"""The paper tasks a judge performs, as batched, concurrent calls that return None for an unscorable item.

`JudgeTasks` builds each task's prompt (`prompts`), picks its strict parser (`parsing`) and hands the batch to the
request engine (`LiteLLMJudge._batch` / `_abatch`: cache, de-duplication, concurrency, retries). Every method has
a blocking form for TRL's training step and an `a*` coroutine for callers that are already async.

An unscorable item is None. Callers that must say *why* (`ppm-trl prepare`'s failures file) pass `explain=True` to
the `a*` methods and get a `JudgeFailure` record in its place: a request error (HTTP 400 context too long, retries
exhausted on 5xx/timeouts, ...) or an answer that arrived but could not be read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ppm_trl.judge import answers, parsing, prompts

Parser = Callable[[str], Any]  # the answer text → the parsed value, or None when it cannot be read
Job = tuple[list[dict[str, str]], Parser]

REQUEST_ERROR = "request_error"  # the judge could not be asked: HTTP 4xx, retries exhausted, ... (`reason` says)
UNREADABLE = "unreadable"  # the judge answered, but no answer (of any attempt) could be read by the task's parser


@dataclass(frozen=True)
class JudgeFailure:
    """Why one item is unscorable: `kind` is REQUEST_ERROR or UNREADABLE; `reason` is the redacted detail (the
    error type, HTTP status and server message, or the start of the last unreadable answer). Falsy, like None."""

    kind: str
    reason: str
    attempts: int

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        what = "judge request failed" if self.kind == REQUEST_ERROR else "judge answer unreadable"
        return f"{what} after {self.attempts} attempt(s): {self.reason}"


class JudgeTasks(ABC):
    """Mixin of `LiteLLMJudge`, which provides `_batch(jobs)`, `_abatch(jobs)` and `stats`."""

    @abstractmethod
    def _batch(self, jobs: Sequence[Job], explain: bool = False) -> list[Any]:
        """Answer the jobs concurrently (blocking); None (or, with `explain`, a `JudgeFailure`) for an item that
        could not be graded."""

    @abstractmethod
    async def _abatch(self, jobs: Sequence[Job], explain: bool = False) -> list[Any]:
        """The same, awaitable."""

    def complete(self, messages: Sequence[list[dict[str, str]]], parse: Parser | None = None) -> list[Any]:
        """Raw batched access: each chat `messages` list → `parse(answer)` (default: the non-empty text) or None."""
        default = lambda text: text if text.strip() else None  # noqa: E731
        return self._batch([(list(m), parse or default) for m in messages])

    def _grading_jobs(self, items, style: str):
        if style not in ("ppm", "standard"):
            raise ValueError(f"unknown grading style {style!r}; accepted: 'ppm' (App. D) or 'standard' (§5.3 baseline)")
        build = prompts.ppm_grading_messages if style == "ppm" else prompts.standard_rubric_messages
        reader = parsing.parse_point_grades if style == "ppm" else parsing.parse_numbered_grades
        jobs, empty = [], []
        for index, item in enumerate(items):
            problem, points, prefix = _unpack(item, 3, index, "(problem, reference_points, prefix_text)")
            points = _check_points(points, index)
            if not str(prefix).strip():
                empty.append(index)  # an empty prefix reaches nothing: no request
                continue
            messages = build(str(problem), points, str(prefix))
            if style == "ppm":  # the answer restates the criteria and quotes the rollout: check both
                reader = functools.partial(parsing.parse_point_grades, points=[prompts.rubric_point(p) for p in points],
                                           rollout=_rollout_shown(messages))
            jobs.append((index, messages, functools.partial(reader, num_points=len(points))))
        return jobs, empty

    def _merge_grades(self, items, jobs, empty, grades) -> list[list[bool] | None]:
        out: list[list[bool] | None] = [None] * len(items)
        for index in empty:
            out[index] = [False] * len(items[index][1])
        for (index, _, _), grade in zip(jobs, grades):
            out[index] = grade
        self.stats.add(skipped_empty=len(empty))
        return out

    def grade_prefixes(self, items: Sequence[tuple[str, Sequence[str], str]], style: str = "ppm") -> list[list[bool] | None]:
        """PPM prefix grading (App. D): for each (problem, reference_points, prefix_text), one bool per point
        (reached or not), or None when the judge's answer could not be read. Empty prefixes send no request."""
        items = list(items)
        jobs, empty = self._grading_jobs(items, style)
        grades = self._batch([(messages, parse) for _, messages, parse in jobs])
        return self._merge_grades(items, jobs, empty, grades)

    async def agrade_prefixes(self, items, style: str = "ppm", explain: bool = False) -> list[list[bool] | None]:
        items = list(items)
        jobs, empty = self._grading_jobs(items, style)
        grades = await self._abatch([(messages, parse) for _, messages, parse in jobs], explain)
        return self._merge_grades(items, jobs, empty, grades)

    def _rubric_jobs(self, items, tier: str):
        if tier not in prompts.PAPO_TIERS:
            raise ValueError(f"unknown rubric tier {tier!r}; accepted: {sorted(prompts.PAPO_TIERS)}")
        allowed = prompts.PAPO_TIERS[tier][1]
        jobs = []
        for index, item in enumerate(items):
            problem, reference, response = _unpack(item, 3, index, "(problem, reference_solution, response)")
            messages = prompts.papo_rubric_messages(str(problem), str(reference), str(response), tier)
            jobs.append((messages, lambda text: parsing.parse_boxed_score(text, allowed)))
        return jobs

    def score_rubric(self, items: Sequence[tuple[str, str, str]], tier: str = "three_tier") -> list[float | None]:
        """PAPO process score (A.3 rubric prompt): for each (problem, reference_solution, response), the judge's
        score in {0, 0.5, 1} ('three_tier') or {0, .25, .5, .75, 1} ('five_tier'), or None if unreadable."""
        return self._batch(self._rubric_jobs(list(items), tier))

    async def ascore_rubric(self, items, tier: str = "three_tier", explain: bool = False) -> list[float | None]:
        return await self._abatch(self._rubric_jobs(list(items), tier), explain)

    def review_process(self, items: Sequence[tuple[str, Sequence[str]]]) -> list[bool | None]:
        """Process-reward baseline (PPM App. B.1/D): for each (problem, parts), True if the judge concludes
        'Correct', False for 'Incorrect', None if unreadable."""
        jobs = []
        for index, item in enumerate(items):
            problem, parts = _unpack(item, 2, index, "(problem, parts)")
            if isinstance(parts, str):
                parts = [parts]
            jobs.append((prompts.process_reward_messages(str(problem), [str(p) for p in parts]), parsing.parse_process_verdict))
        return self._batch(jobs)

    def _points_job(self, problem: str, reference: str, answer: str | None):
        def read(text: str) -> list[str] | None:
            points = parsing.parse_rubric(text)
            if points is None or (answer is not None and not answers.states_answer(points[-1], answer)):
                return None
            return points

        return prompts.rubric_generation_messages(str(problem), str(reference)), read

    def generate_points(self, problem: str, reference: str, answer: str | None = None) -> list[str] | None:
        """Reasoning points (the App. D rubric) for one problem; with `answer`, the last point must state it
        (checked with math-verify, so `72`, `72.0` and `\\$72` agree; see `answers.states_answer`)."""
        return self._batch([self._points_job(problem, reference, answer)])[0]

    async def agenerate_points(self, problem: str, reference: str, answer: str | None = None,
                               explain: bool = False) -> list[str] | None:
        return (await self._abatch([self._points_job(problem, reference, answer)], explain))[0]

    def _graph_job(self, problem: str, points: Sequence[str]):
        points = _check_points(points, 0)
        return prompts.obsoletion_graph_messages(str(problem), points), lambda text: parsing.parse_graph(text, len(points))

    def generate_graph(self, problem: str, points: Sequence[str]) -> list[dict[str, list[int]]] | None:
        """Obsoletion graph (App. D) over `points` as records [{"if_all": [...], "makes_obsolete": [...]}]."""
        return self._batch([self._graph_job(problem, points)])[0]

    async def agenerate_graph(self, problem: str, points: Sequence[str],
                              explain: bool = False) -> list[dict[str, list[int]]] | None:
        return (await self._abatch([self._graph_job(problem, points)], explain))[0]


def _rollout_shown(messages: list[dict[str, str]]) -> str:
    """The (escaped) rollout as the PPM grading prompt shows it: between the template's own `<rollout>` tags (the
    problem's and the rollout's tags are neutralised, so the first pair is the template's)."""
    user = messages[-1]["content"]
    start = user.find("<rollout>")
    end = user.find("</rollout>", start)
    return user[start + len("<rollout>") : end] if 0 <= start < end else user


# ------------------------------------------------------------------------------------------ request nonce
NONCE_INSTRUCTION = "Begin your answer with the line `Request-ID: {nonce}` (copied exactly), then answer as asked."
_NONCE_LINE = re.compile(r"[ \t\n>*_`]*request[ \t_-]*id[ \t*_`]*:[ \t*_`]*([0-9a-f]{8,64})[ \t*_`.]*(?:\r?\n|$)",
                         re.IGNORECASE)


def request_nonce(messages: list[dict[str, str]]) -> str:
    """A nonce that identifies the request (a hash of its messages): the same request always gets the same one, so
    answers stay cacheable, and an answer to any other request carries another."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def with_nonce(messages: list[dict[str, str]], parse: Parser) -> tuple[list[dict[str, str]], Parser]:
    """`messages` asking the judge to echo the request's nonce first, and a parser that refuses (None: retried,
    never cached) an answer that does not start with it, then parses the rest with `parse`."""
    nonce = request_nonce(messages)
    instruction = NONCE_INSTRUCTION.format(nonce=nonce)
    messages = [dict(message) for message in messages]
    target = messages[0] if messages[0].get("role") == "system" else messages[-1]
    target["content"] = f"{target['content']}\n\n{instruction}"

    def read(text: str) -> Any:
        match = _NONCE_LINE.match(text) if isinstance(text, str) else None
        if match is None or match.group(1).lower() != nonce:
            return None
        return parse(text[match.end():])

    return messages, read


def _unpack(item: Any, size: int, index: int, shape: str) -> tuple:
    if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != size:
        raise ValueError(f"judge item {index}: expected a tuple {shape}, got {type(item).__name__}")
    return tuple(item)


def _check_points(points: Any, index: int) -> list[str]:
    if isinstance(points, str) or not isinstance(points, Sequence) or not points:
        raise ValueError(f"judge item {index}: reference points must be a non-empty list of strings, got {points!r}")
    if not all(isinstance(p, str) and p.strip() for p in points):
        raise ValueError(f"judge item {index}: every reference point must be a non-empty string, got {points!r}")
    return list(points)
