"""Row quarantine: a dataset row the judge cannot score (its every request unscorable, again and again, while the
judge scores other rows) is set aside instead of stopping the run.

`QuarantiningJudge` wraps the judge a scorer calls. Each task item is the row's content as the judge sees it (the
problem text, `problem_text(row)`, first; then the task's row fields: reasoning points, reference) followed by the
completion text; the row's key is the sha256 of that content (`row_key`), so a row that repeats another row's problem
but differs elsewhere (a poisoned copy of a clean row) has a key of its own. Items of a quarantined row send no
request: they are unscorable (None → NaN score → advantage 0), counted in the judge's `quarantined`
statistic. Every other call records, per row, how many of its requests were sent and how many came back
unscorable; `JudgeStatsCallback` collects those records after each optimizer step (over all processes), decides
quarantines (`RowQuarantine`) and lists them in `<output_dir>/quarantine.jsonl`.

`quarantine.jsonl` holds one JSON object per line, written ASCII-escaped (`append_quarantine_records`): dataset text
cannot start a line of its own or carry a raw control character (terminal escape sequences) into the file. On
resume (`read_quarantine_file`) a torn last line — a crash in the middle of an append — is skipped with a warning
naming the file and cut off the file, so the next append starts on a line of its own.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

TASKS = ("grade_prefixes", "score_rubric", "review_process")  # the judge tasks the training scorers use
QUARANTINE_FILE = "quarantine.jsonl"
_SHOWN_PROBLEM_CHARS = 2000

logger = logging.getLogger(__name__)


def row_key(problem: str, *row_fields) -> str:
    """The stable key of a dataset row (hex sha256) from its full content as the judge sees it: the problem text and
    the task's row fields (`grade_prefixes`: the reasoning points; `score_rubric`: the reference)."""
    content = json.dumps([str(problem), *row_fields], ensure_ascii=False, sort_keys=True, default=repr)
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def item_row_key(item) -> str:
    """`row_key` of a task item: every element but the last, which is the completion text being judged."""
    return row_key(*item[:-1])


class QuarantiningJudge:
    """The judge, with the `TASKS` skipping quarantined rows and recording per-row outcomes (thread-safe: PPM scores
    on a worker thread). Everything else is the wrapped judge's."""

    def __init__(self, judge):
        self.judge = judge
        self.quarantined: set[str] = set()
        self._lock = threading.Lock()
        self._attempts: dict[str, list] = {}  # key -> [problem, requests sent, unscorable], since `take_attempts`

    def __getattr__(self, name: str):
        if name in TASKS:
            return lambda items, *args, **kwargs: self._task(name, items, *args, **kwargs)
        return getattr(self.judge, name)

    def _task(self, name: str, items, *args, **kwargs) -> list:
        items = list(items)
        keys = [item_row_key(item) for item in items]
        sent = [i for i, key in enumerate(keys) if key not in self.quarantined]
        if len(sent) < len(items):
            self.judge.stats.add(quarantined=len(items) - len(sent))
        answers = getattr(self.judge, name)([items[i] for i in sent], *args, **kwargs) if sent else []
        results: list[Any] = [None] * len(items)
        with self._lock:
            for i, answer in zip(sent, answers):
                results[i] = answer
                record = self._attempts.setdefault(keys[i], [str(items[i][0]), 0, 0])
                record[1] += 1
                record[2] += answer is None
        return results

    def take_attempts(self) -> dict[str, list]:
        """{key: [problem, sent, unscorable]} recorded since the last call."""
        with self._lock:
            attempts, self._attempts = self._attempts, {}
        return attempts


@dataclass
class RowQuarantine:
    """Which rows to quarantine, from the per-step records of all processes.

    A row's step is an *unscorable attempt* when every request of it in that step failed. A row is quarantined at
    its `after`-th unscorable attempt, provided the judge scored some other row since its first one: a poisoned
    row fails while others succeed, whereas in an outage nothing succeeds and no row is quarantined (the stop rule
    then stops the run). `after` = 0 quarantines nothing."""

    after: int = 2
    quarantined: dict[str, dict] = field(default_factory=dict)  # key -> its quarantine.jsonl record
    failures: dict[str, int] = field(default_factory=dict)
    scored_rows: int = 0  # row-steps with at least one scorable answer, so far
    _scored_at_first_failure: dict[str, int] = field(default_factory=dict)

    def update(self, attempts: dict[str, list], step: int, reason: str | None = None) -> list[dict]:
        """Record one step's merged attempts; returns the records of the rows quarantined now."""
        before = self.scored_rows
        self.scored_rows += sum(1 for _, sent, failed in attempts.values() if failed < sent)
        new = []
        for key, (problem, sent, failed) in sorted(attempts.items()):
            if sent == 0 or failed < sent or key in self.quarantined:
                continue
            self.failures[key] = self.failures.get(key, 0) + 1
            first = self._scored_at_first_failure.setdefault(key, before)
            if self.after and self.failures[key] >= self.after and self.scored_rows > first:
                record = {"key": key, "step": step, "unscorable_attempts": self.failures[key],
                          "problem": problem[:_SHOWN_PROBLEM_CHARS], "last_failure": reason}
                self.quarantined[key] = record
                new.append(record)
        return new


def merge_attempts(per_process: list[dict[str, list]]) -> dict[str, list]:
    """One {key: [problem, sent, unscorable]} from every process's records (a row's requests may be split)."""
    merged: dict[str, list] = {}
    for attempts in per_process:
        for key, (problem, sent, failed) in attempts.items():
            record = merged.setdefault(key, [problem, 0, 0])
            record[1] += sent
            record[2] += failed
    return merged


def install_quarantine(scorer) -> QuarantiningJudge | None:
    """Wrap the judge a scorer calls (`scorer.judge`, or its matcher's) in a `QuarantiningJudge`; None if none."""
    for owner in (scorer, getattr(scorer, "matcher", None)):
        judge = getattr(owner, "judge", None)
        if judge is not None:
            if not isinstance(judge, QuarantiningJudge):
                judge = QuarantiningJudge(judge)
                owner.judge = judge
            return judge
    return None


def append_quarantine_records(path: str, records: list[dict]) -> None:
    """Append `records` to the quarantine list at `path`, one JSON object per line. ASCII-escaped on purpose: a
    problem's line breaks (including U+2028, NEL) and control characters (ESC, C1 CSI) become `\\uXXXX`, so the
    file stays one record per line and `cat` / `tail -f` print no escape sequence from the dataset."""
    with open(path, "a", encoding="ascii") as f:
        f.writelines(json.dumps(record, ensure_ascii=True) + "\n" for record in records)


def read_quarantine_file(path: str, repair: bool = False) -> list[dict]:
    """The records of the quarantine list at `path` ([] when there is none).

    A last line that does not parse and has no line end is a torn append (a crash while writing): it is skipped with
    a warning naming the file, and with `repair` (one process: the one that appends) the file is rewritten without
    it. Any other bad line is a ValueError naming the file and the line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    unterminated = lines.pop()  # b"" when the file ends with a line end
    records = [_parsed_record(path, number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    if unterminated.strip():
        try:
            records.append(_parsed_record(path, len(lines) + 1, unterminated))
        except ValueError:
            logger.warning("%s: skipped its last line, cut off while it was written (%d bytes); the row it named is "
                           "quarantined again if the judge still cannot score it", path, len(unterminated))
    if repair and unterminated:
        _rewrite(path, records)
    return records


def _parsed_record(path: str, number: int, line: bytes) -> dict:
    try:
        record = json.loads(line)
    except ValueError as error:
        raise ValueError(f"{path} line {number} is not JSON ({error}); delete that line (its row is quarantined "
                         "again if still unscorable) or the file") from None
    if not isinstance(record, dict) or not isinstance(record.get("key"), str):
        raise ValueError(f"{path} line {number} is not a quarantine record (an object with a string `key`); delete "
                         "that line or the file")
    return record


def _rewrite(path: str, records: list[dict]) -> None:
    """Replace the list at `path` by `records`, atomically (a reader sees the old file or the new one)."""
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="ascii") as f:
            f.writelines(json.dumps(record, ensure_ascii=True) + "\n" for record in records)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
