"""`ppm-trl prepare`'s work on the judge: points then graph for each pending row (identical rows judged once),
each finished row appended to the progress file at once; a spent budget stops new rows; Ctrl-C cancels the work
on the judge loop and leaves the progress file to resume from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import json
import re
from typing import Any

from ppm_trl.judge import LiteLLMJudge
from ppm_trl.judge import loop as judge_loop
from ppm_trl.judge.arguments import PREPARE_ALIASES, JudgeArguments, flag_of
from ppm_trl.judge.tasks import REQUEST_ERROR, JudgeFailure

SIGNAL_POLL_SECONDS = 0.2  # how often the main thread wakes to notice Ctrl-C while the judge loop works


class PrepareInterrupted(KeyboardInterrupt):
    """Ctrl-C during `prepare`: the finished rows are in the progress file; the same command resumes."""

    def __init__(self, finished: int, total: int):
        super().__init__(f"interrupted after {finished}/{total} rows; rerun the same command to resume")
        self.finished, self.total = finished, total


def row_fingerprint(problem: Any, reference: Any, answer: Any) -> str:
    """What a progress record was judged from (the problem, reference and answer prepare read of its row): a resumed
    prepare keeps a record only for a row that still reads the same, so deleting or editing rows between runs cannot
    attach one row's points to another."""
    content = json.dumps([problem, reference, answer], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class PrepareFailed(RuntimeError):
    """Some rows could not be prepared (listed in the failures file) and --drop-invalid was not given."""


def _failure(stage: str, result: JudgeFailure | None, what: str) -> dict[str, str]:
    """A failures-file record: the real reason a judge step failed."""
    if isinstance(result, JudgeFailure) and result.kind == REQUEST_ERROR:
        return {"stage": stage, "kind": REQUEST_ERROR,
                "reason": f"judge request failed ({stage}) after {result.attempts} attempt(s): {result.reason}"}
    detail = f" after {result.attempts} attempt(s); last {result.reason}" if isinstance(result, JudgeFailure) else ""
    return {"stage": stage, "kind": "unreadable", "reason": f"judge answered but {what}{detail}"}


class PrepareBudgetSpent(PrepareFailed):
    """The judge's budget (--max-cost-usd / --max-total-tokens) was spent; the finished rows are kept."""


_FIELDS = sorted((spec.name for spec in dataclasses.fields(JudgeArguments)), key=len, reverse=True)
_SETTING = re.compile(r"\b(?:" + "|".join(_FIELDS) + r"|max_cost_usd|max_total_tokens)\b")


def _in_prepare_spelling(message: str) -> str:
    """A judge message with its setting names (`judge_max_cost_usd`, `max_total_tokens=...`, `judge_timeout`) as
    `prepare` flags."""
    def flag(match: re.Match) -> str:
        name = match.group(0)
        return flag_of(name if name.startswith("judge_") else f"judge_{name}", PREPARE_ALIASES)

    flagged = _SETTING.sub(flag, message)
    return re.sub(r"(--[\w-]+)(=\S+) \(\1\)", r"\1\2", flagged)  # "--max-cost-usd=$5 (--max-cost-usd)"


def duplicate_groups(jobs: list[tuple[int, str, Any, str]]) -> list[list[tuple[int, str, Any, str]]]:
    """Jobs grouped by (problem, reference, answer), in first-seen order: each group is judged once."""
    groups: dict[str, list] = {}
    for job in jobs:
        groups.setdefault(json.dumps(job[1:], ensure_ascii=False, default=repr), []).append(job)
    return list(groups.values())


async def _prepare_pending(judge: LiteLLMJudge, jobs, progress, bar, window: int, finished: list[int]):
    """Points then graph for each pending row (rows with the same problem, reference and answer judged once),
    appending each finished row to the progress file (and counting it in `finished[0]`); returns the failure record
    of each row that failed. Once the judge's budget is spent no new row starts (`PrepareBudgetSpent` after the
    rows in flight finish)."""
    slots = asyncio.Semaphore(window)
    failures: dict[int, dict[str, str]] = {}
    spent: list[str] = []

    async def one(group: list[tuple[int, str, Any, str]]) -> None:
        _, problem, reference, answer = group[0]
        indices = [job[0] for job in group]
        async with slots:
            if spent:
                return
            reason = judge.budget_exhausted()
            if reason is not None:
                spent.append(reason)
                return
            points = await judge.agenerate_points(problem, reference, answer, explain=True)
            if not points:
                failure = _failure("rubric", points, f"no readable <rubric> whose last point states the final "
                                   f"answer {answer!r}")
            else:
                graph = await judge.agenerate_graph(problem, points, explain=True)
                failure = None if not isinstance(graph, JudgeFailure) else _failure(
                    "graph", graph, f"no valid <makes_obsolete_graph> over the {len(points)} points")
            for index in indices:
                if failure is not None:
                    failures[index] = failure
                else:
                    record = {"index": index, "row": row_fingerprint(problem, reference, answer),
                              "reasoning_points": points, "reasoning_graph": graph}
                    progress.write(json.dumps(record, ensure_ascii=False) + "\n")
                    finished[0] += 1
            progress.flush()
        bar.update(len(indices))

    await asyncio.gather(*(one(group) for group in duplicate_groups(jobs)))
    if spent:
        raise PrepareBudgetSpent(
            f"{_in_prepare_spelling(spent[0])}; stopped after {finished[0]} prepared rows (written, and kept in the "
            "progress file). Rerun the same command with a larger budget to prepare the rest.")
    return failures


def _run_interruptibly(judge: LiteLLMJudge, factory, finished: list[int], total: int):
    """Run the prepare coroutine on the judge loop; on Ctrl-C cancel it (no request left running, no second
    traceback from the loop's thread) and raise `PrepareInterrupted`."""
    loop, _ = judge_loop.judge_loop()
    future = asyncio.run_coroutine_threadsafe(factory(), loop)
    try:
        # Short waits, not one: a SIGINT that the kernel delivers to another thread (the judge loop's) only sets
        # a flag, and the main thread runs Python's handler when it next wakes — with `result()` alone, at the end.
        while True:
            try:
                return future.result(timeout=SIGNAL_POLL_SECONDS)
            except concurrent.futures.TimeoutError:
                continue
    except KeyboardInterrupt:
        future.cancel()
        try:
            future.exception(timeout=10)  # wait for the cancellation to reach the tasks
        except BaseException:  # noqa: BLE001 - cancelled, a timeout, or a second Ctrl-C: all mean "stop"
            pass
        raise PrepareInterrupted(finished[0], total) from None
