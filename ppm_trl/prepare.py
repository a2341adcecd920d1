"""`ppm-trl prepare`: reasoning points and obsoletion graph for every row of a dataset (PPM paper App. D).

Each row's gold final answer comes from `--answer-column` when given, else from the reference solution: its last
`\\boxed{}` (or `<answer>`; MATH-style), else its last `#### ` line (GSM8K-style). A row without one is skipped
before any judge call, left out of the dataset and listed in the failures file, as is a row that can never be
prepared as it is (an empty problem or reference, a chat without a user turn or without an assistant reply, a row
the judge refuses with HTTP 4xx such as one longer than its context). The judge is probed with one tiny request first (a refused
key, an unknown model or no server stop the run before any work). Then the judge turns each reference solution
into a rubric of reasoning points, whose last one must state the gold answer (checked with math-verify), and
builds the obsoletion graph over those points, validated by `ReasoningGraph`. Finished rows are appended to
`prepare_progress.jsonl` in the output (or work) directory as they complete, so an interrupted run (Ctrl-C: exit
130) resumes without redoing them. Every row that is not written is listed in `prepare_failures.jsonl`, one JSON
line each with the real reason and `"retry"`: false for the rows above (fix them in the source to include them),
true for a judge failure that a rerun may not repeat (a request that failed after its retries, an answer that could
not be read). Rows of the first kind are always left out; rows of the second kind make `prepare` exit 1 without
writing the dataset (rerun the same command to retry only them) unless `--drop-invalid` writes it without them.
A spent judge budget (`--max-cost-usd`, `--max-total-tokens`) writes the rows prepared so far and exits 3.

The result trains as-is with `ppm-trl train --method ppm|papo|arg`: the input columns plus
  prompt            [{"role": "user", "content": <problem>}] (a conversational problem cell is kept as it is)
  answer            the gold final answer (for `accuracy_reward`)
  reference         the worked reference solution (PAPO's judge, ARG's guidance)
  reasoning_points  list[str], the last one stating the answer
  reasoning_graph   list of {"if_all": [...], "makes_obsolete": [...]}, 1-based
An input column `prompt`/`answer`/`reference` whose values differ is replaced, its values kept as
`original_<name>` (reported). Saved with `save_to_disk` or pushed to the Hub.

    ppm-trl prepare --dataset gsm8k.jsonl --problem-column question --reference-column answer \\
        --judge-model hosted_vllm/Qwen/Qwen3-8B --api-base http://127.0.0.1:8000/v1 --out prepared/
    ppm-trl prepare --dataset math.jsonl --problem-column problem --reference-column solution \\
        --judge-model gemini/gemini-2.5-flash-lite --out prepared/
    python -m ppm_trl.prepare ...   (same arguments)
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import sys
from typing import Any

from ppm_trl.columns import (
    boxed_reference,
    chat_prompt,
    chat_reply,
    gold_answer,
    gsm8k_answer,
    is_chat,
    is_solution_column,
)
from ppm_trl.judge import LiteLLMJudge, final_answer_of
from ppm_trl.judge import loop as judge_loop
from ppm_trl.judge.tasks import REQUEST_ERROR, JudgeFailure
from ppm_trl.judge.transport import TRANSPORTS
from ppm_trl.text import normalize_boxes

PROGRESS_FILE = "prepare_progress.jsonl"
FAILURES_FILE = "prepare_failures.jsonl"
NO_ANSWER = "no_answer"  # failure kind of a row whose gold answer cannot be found (no judge call is spent on it)
INVALID_ROW = "invalid_row"  # an empty problem or reference, a chat without a user turn or an assistant reply
# A judge that refuses the row itself (HTTP 4xx, e.g. longer than its context) refuses it again on every rerun.
_REFUSED_BY_JUDGE = re.compile(r"\(HTTP 4\d\d\)")
WRITTEN_COLUMNS = ("prompt", "answer", "reference")
_DATA_FILE_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def add_prepare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", required=True,
                      help="Hub dataset id, a directory written by save_to_disk, or a .json/.jsonl/.parquet/.csv file.")
    data.add_argument("--split", default="train", help="Split to prepare (Hub datasets and DatasetDicts).")
    data.add_argument("--config-name", default=None, help="Hub dataset configuration name.")
    data.add_argument("--reference-column", required=True, help="Column with the reference solution text.")
    data.add_argument("--problem-column", default="prompt",
                      help="Column with the problem: plain text or a conversational prompt (last user message).")
    data.add_argument("--answer-column", default=None,
                      help="Column with the gold final answer (default: extracted from the reference solution: its "
                           "last \\boxed{}, else a GSM8K '#### ' line).")
    data.add_argument("--limit", type=int, default=None, help="Prepare only the first N rows.")
    judge = parser.add_argument_group("judge")
    judge.add_argument("--judge-model", required=True, help="LiteLLM model string, e.g. gemini/gemini-2.5-flash-lite.")
    judge.add_argument("--api-base", default=None, help="Server URL for self-hosted judges (vLLM, SGLang).")
    judge.add_argument("--api-key-env", default=None, help="Environment variable holding the API key, if not the provider's.")
    judge.add_argument("--max-concurrency", type=int, default=64)
    judge.add_argument("--timeout", type=float, default=120.0, help="Seconds per judge attempt.")
    judge.add_argument("--num-retries", type=int, default=4)
    judge.add_argument("--temperature", type=float, default=0.0)
    judge.add_argument("--transport", choices=sorted(TRANSPORTS), default="litellm")
    judge.add_argument("--cache-dir", default=None,
                       help="Judge answer cache (default: <work dir>/judge_cache; `none`: no cache).")
    judge.add_argument("--max-rpm", type=float, default=None, help="Judge requests per minute at most (a quota).")
    judge.add_argument("--max-tpm", type=float, default=None, help="Judge tokens per minute at most (a quota).")
    judge.add_argument("--max-cost-usd", type=float, default=None,
                       help="Stop starting rows once the judge has cost this much (finished rows are kept).")
    judge.add_argument("--max-total-tokens", type=int, default=None,
                       help="Stop starting rows once the judge has used this many tokens (finished rows are kept).")
    judge.add_argument("--max-response-bytes", type=int, default=4 * 2**20,
                       help="Largest judge answer body (bytes, decoded) an attempt accepts.")
    judge.add_argument("--echo-nonce", action="store_true",
                       help="Make the judge echo a per-request nonce; refuse answers without it.")
    output = parser.add_argument_group("output")
    target = output.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", default=None, help="Directory for the prepared dataset (save_to_disk).")
    target.add_argument("--push-to-hub", default=None, help="Hub dataset id to push the prepared dataset to.")
    output.add_argument("--private", action="store_true", help="With --push-to-hub: create a private dataset.")
    output.add_argument("--work-dir", default=None,
                        help="Progress and cache directory (default: --out, or ./ppm_trl_prepare/<hub id>).")
    output.add_argument("--drop-invalid", action="store_true",
                        help="Write the dataset without the rows the judge failed on this time (default: exit 1 so "
                             "that a rerun retries them). Rows that can never be prepared as they are (no final "
                             "answer, an empty cell, a chat without a reply) are left out either way.")
    output.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")
    judge.add_argument("--no-judge-probe", action="store_true",
                       help="Skip the one tiny request that checks the judge (key, model, server) before any work.")
    return parser


def load_rows(args: argparse.Namespace):
    """The dataset split named by the arguments (a `datasets.Dataset`)."""
    import datasets

    from ppm_trl.cli import check_data_file, load_hub_dataset

    path = args.dataset
    extension = os.path.splitext(path)[1].lower()
    if os.path.isdir(path):
        loaded = datasets.load_from_disk(path)
        if isinstance(loaded, datasets.DatasetDict):
            if args.split not in loaded:
                raise ValueError(f"--split {args.split!r} is not in {path}; available splits: {sorted(loaded)}")
            print(f"prepare: split {args.split!r} of {path} (its splits: {', '.join(loaded)}; choose with --split)")
            loaded = loaded[args.split]
    elif os.path.isfile(path) and extension in _DATA_FILE_FORMATS:
        check_data_file(path)  # an empty, non-UTF-8 or broken file is named with its line
        loaded = datasets.load_dataset(_DATA_FILE_FORMATS[extension], data_files=path, split="train")
    elif os.path.exists(path):
        raise ValueError(f"--dataset {path!r}: unsupported file type; accepted: a save_to_disk directory or "
                         f"{sorted(_DATA_FILE_FORMATS)}")
    else:
        loaded = load_hub_dataset(path, args.config_name, args.split)
        print(f"prepare: split {args.split!r} of the Hub dataset {path} (choose with --split)")
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        loaded = loaded.select(range(min(args.limit, len(loaded))))
    return loaded


def problem_of(value: Any, column: str, index: int) -> str:
    """Problem text of a plain or conversational (list of messages) cell."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        user = [m["content"] for m in value if m.get("role") == "user"]
        content = user[-1] if user else value[-1]["content"]
        if isinstance(content, str) and content.strip():
            return content
    raise ValueError(f"row {index}: column {column!r} must be non-empty text or a list of chat messages, got {value!r:.200}")


SIGNAL_POLL_SECONDS = 0.2  # how often the main thread wakes to notice Ctrl-C while the judge loop works


class PrepareInterrupted(KeyboardInterrupt):
    """Ctrl-C during `prepare`: the finished rows are in the progress file; the same command resumes."""

    def __init__(self, finished: int, total: int):
        super().__init__(f"interrupted after {finished}/{total} rows; rerun the same command to resume")
        self.finished, self.total = finished, total


class PrepareFailed(RuntimeError):
    """Some rows could not be prepared (listed in the failures file) and --drop-invalid was not given."""


def check_columns(dataset, args: argparse.Namespace) -> None:
    named = [("--reference-column", args.reference_column), ("--problem-column", args.problem_column)]
    if args.answer_column is not None:
        named.append(("--answer-column", args.answer_column))
    for flag, column in named:
        if column not in dataset.column_names:
            raise ValueError(f"{flag} {column!r} is not a column of {args.dataset}; columns: {dataset.column_names}")


def solution_text(value: Any, column: str, index: int) -> Any:
    """A chat cell read as its solution (the assistant turn after the last user turn); other cells as they are."""
    return chat_reply(value, column, index) if is_chat(value) else value


def reference_of(value: Any, column: str, index: int) -> str:
    """The reference solution of a cell (a chat's reply), box spellings normalised; a ValueError naming the row
    when there is none (an empty cell, a chat without an assistant reply)."""
    if is_chat(value):
        return normalize_boxes(chat_reply(value, column, index))
    if not isinstance(value, str) or not value.strip():
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ValueError(f"row {index}: column {column!r} must be a non-empty reference solution text or a chat "
                         f"whose assistant turn is the solution, got {type(value).__name__} {shown}")
    return normalize_boxes(value)


def work_dir_of(args: argparse.Namespace) -> str:
    if args.work_dir:
        return args.work_dir
    if args.out:
        return args.out
    return os.path.join("ppm_trl_prepare", re.sub(r"[^\w.-]+", "_", args.push_to_hub))


def read_progress(path: str, meta: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Finished rows of an earlier run with the same settings (a torn last line from an interruption is ignored)."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    done: dict[int, dict[str, Any]] = {}
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines) - 1:
                break  # the write that was interrupted
            raise ValueError(f"{path}: line {number + 1} is not JSON; delete the file to start over") from None
        if "meta" in record:
            if record["meta"] != meta:
                raise ValueError(f"{path} was written with different settings {record['meta']}; now {meta}. "
                                 "Use another --out/--work-dir, or delete the file to start over.")
            continue
        done[int(record["index"])] = record
    return done


def answer_of(row: dict[str, Any], args: argparse.Namespace, index: int = 0,
              solution_column: bool = False) -> tuple[str | None, str]:
    """(gold final answer or None, where it came from: the column name, 'boxed', 'gsm8k' or 'none').

    `--answer-column` is read as `train --answer_column` reads it (`columns.gold_answer`): in a column of worked
    solutions (`solution_column`: `columns.is_solution_column`) a cell without `####` or `\\boxed{}` has none."""
    if args.answer_column is not None:
        value = row[args.answer_column]
        if is_chat(value):  # the assistant turn is a worked solution: its final answer, as for a reference
            reply = normalize_boxes(chat_reply(value, args.answer_column, index))
            answer = final_answer_of(reply) or gsm8k_answer(reply)
        else:
            answer = gold_answer(value, solution_column)
        return answer, (args.answer_column if answer is not None else "none")
    reference = normalize_boxes(solution_text(row[args.reference_column], args.reference_column, index))
    boxed = final_answer_of(reference)
    if boxed is not None:
        return boxed, "boxed"
    gsm8k = gsm8k_answer(reference)
    return (gsm8k, "gsm8k") if gsm8k is not None else (None, "none")


def describe_answers(sources: list[str], args: argparse.Namespace) -> str:
    """One line saying where the gold answers came from, e.g. "GSM8K-style answers: 20/20 extracted"."""
    total = len(sources)
    if args.answer_column is not None:
        found = sum(source == args.answer_column for source in sources)
        return f"answers from column {args.answer_column!r}: {found}/{total} found"
    column = args.reference_column
    names = {"boxed": ("MATH-style answers", f"last \\boxed{{}} of {column!r}"),
             "gsm8k": ("GSM8K-style answers", f"'#### ' line of {column!r}")}
    parts = [f"{names[kind][0]}: {sources.count(kind)}/{total} extracted ({names[kind][1]})"
             for kind in ("boxed", "gsm8k") if kind in sources]
    if "none" in sources:
        parts.append(f"no answer found: {sources.count('none')}/{total} (skipped, listed in {FAILURES_FILE})")
    if "invalid" in sources:
        parts.append(f"unusable rows: {sources.count('invalid')}/{total} (skipped, listed in {FAILURES_FILE})")
    return "; ".join(parts) if parts else "no rows"


def _failure(stage: str, result: JudgeFailure | None, what: str) -> dict[str, str]:
    """A failures-file record: the real reason a judge step failed."""
    if isinstance(result, JudgeFailure) and result.kind == REQUEST_ERROR:
        return {"stage": stage, "kind": REQUEST_ERROR,
                "reason": f"judge request failed ({stage}) after {result.attempts} attempt(s): {result.reason}"}
    detail = f" after {result.attempts} attempt(s); last {result.reason}" if isinstance(result, JudgeFailure) else ""
    return {"stage": stage, "kind": "unreadable", "reason": f"judge answered but {what}{detail}"}


class PrepareBudgetSpent(PrepareFailed):
    """The judge's budget (--max-cost-usd / --max-total-tokens) was spent; the finished rows are kept."""


# The judge names its settings as the training config does; `prepare` takes them as these flags.
_PREPARE_FLAGS = {"judge_max_cost_usd": "--max-cost-usd", "judge_max_total_tokens": "--max-total-tokens",
                  "max_cost_usd": "--max-cost-usd", "max_total_tokens": "--max-total-tokens"}


def _in_prepare_spelling(message: str) -> str:
    """A judge message with its setting names (`judge_max_cost_usd`, `max_total_tokens=...`) as `prepare` flags."""
    flagged = re.sub(r"\b(?:judge_)?max_(?:cost_usd|total_tokens)\b",
                     lambda match: _PREPARE_FLAGS[match.group(0)], message)
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
                    record = {"index": index, "reasoning_points": points, "reasoning_graph": graph}
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


def _summary(failures: dict[int, dict[str, str]]) -> str:
    kinds = {NO_ANSWER: "without a final answer (no judge call)",
             INVALID_ROW: "with an empty problem or reference, or a chat without a user turn or an assistant reply",
             REQUEST_ERROR: "with a judge request error", "unreadable": "with an unreadable judge answer"}
    counts = [f"{sum(f['kind'] == kind for f in failures.values())} {label}" for kind, label in kinds.items()
              if any(f["kind"] == kind for f in failures.values())]
    return ", ".join(counts)


def run_prepare(args: argparse.Namespace):
    """Prepare the dataset; returns the `datasets.Dataset` that was written."""
    from tqdm.auto import tqdm

    dataset = load_rows(args)
    check_columns(dataset, args)
    work_dir = work_dir_of(args)
    os.makedirs(work_dir, exist_ok=True)
    meta = {"dataset": args.dataset, "split": args.split, "config_name": args.config_name,
            "reference_column": args.reference_column, "problem_column": args.problem_column,
            "answer_column": args.answer_column, "judge_model": args.judge_model}
    progress_path = os.path.join(work_dir, PROGRESS_FILE)
    done = read_progress(progress_path, meta)
    rows = dataset.to_list()
    solution_column = args.answer_column is not None and (
        args.answer_column == args.reference_column or is_solution_column(dataset[args.answer_column]))
    # Each row read on its own: a row that can never be prepared is recorded (and left out), not fatal.
    problems, prompts, references, answers, sources = [], [], [], [], []
    failures: dict[int, dict[str, Any]] = {}
    for index, row in enumerate(rows):
        try:
            problem = problem_of(row[args.problem_column], args.problem_column, index)
            prompt = _conversational(row[args.problem_column], problem)
            reference = reference_of(row[args.reference_column], args.reference_column, index)
            answer, source = answer_of(row, args, index, solution_column)
        except ValueError as error:
            problem = prompt = reference = answer = None
            source = "invalid"
            failures[index] = {"stage": "row", "kind": INVALID_ROW, "reason": str(error)}
        problems.append(problem)
        prompts.append(prompt)
        references.append(reference)
        answers.append(answer)
        sources.append(source)
    print(f"prepare: {describe_answers(sources, args)}")
    if rows and len(failures) == len(rows):
        first = min(failures)
        raise ValueError(f"no row of {args.dataset} can be prepared; first, row {first}: {failures[first]['reason']}")
    if rows and not any(answers):
        raise ValueError(f"no final answer found in any row of {args.dataset}: "
                         + (f"column {args.answer_column!r} is empty" if args.answer_column else
                            f"column {args.reference_column!r} has no \\boxed{{}} and no GSM8K '#### ' line")
                         + "; name the gold answer column with --answer-column")
    for index in range(len(rows)):
        if answers[index] is None and index not in failures:
            failures[index] = {
                "stage": "answer", "kind": NO_ANSWER,
                "reason": (f"no final answer: column {args.answer_column!r} has none in this row" if args.answer_column
                           else f"no final answer: column {args.reference_column!r} has no \\boxed{{}} and no "
                           "'#### ' line in this row")}
    for index in done:
        failures.pop(index, None)  # prepared by an earlier run
    for column in WRITTEN_COLUMNS:  # refused now, not after the judge's work
        if column in dataset.column_names and f"original_{column}" in dataset.column_names:
            raise ValueError(f"the input has both {column!r} and 'original_{column}' columns: prepare writes its own "
                             f"{column!r} and keeps an input one as 'original_{column}'; rename or drop one of them")
    jobs = [(index, problems[index], references[index], answers[index])
            for index in range(len(rows)) if index not in done and index not in failures]
    print(f"prepare: {len(rows)} rows, {len(done)} already done in {progress_path}, {len(jobs)} to prepare")
    duplicates = len(jobs) - len(duplicate_groups(jobs))
    if duplicates:
        print(f"prepare: {duplicates} row(s) repeat an earlier row's problem, reference and answer: each distinct "
              "row is judged once and its points are written to every copy")

    judge = LiteLLMJudge(args.judge_model, api_base=args.api_base, max_concurrency=args.max_concurrency,
                         timeout=args.timeout, num_retries=args.num_retries, temperature=args.temperature,
                         cache_dir=judge_cache_dir(args.cache_dir, work_dir),
                         api_key_env=args.api_key_env, transport=args.transport, max_rpm=args.max_rpm,
                         max_tpm=args.max_tpm, max_cost_usd=args.max_cost_usd,
                         max_total_tokens=args.max_total_tokens,
                         max_response_bytes=args.max_response_bytes, echo_nonce=args.echo_nonce)
    if jobs and not args.no_judge_probe:
        judge.probe()  # a judge that cannot answer fails here, before any row's work
    finished = [len(done)]  # rows in the progress file, for the Ctrl-C message
    budget_spent = None
    with open(progress_path, "a", encoding="utf-8") as progress, \
            tqdm(total=len(rows), initial=len(done) + len(failures), desc="prepare", disable=args.no_progress) as bar:
        if not done:
            progress.write(json.dumps({"meta": meta}) + "\n")
        try:
            failures |= _run_interruptibly(
                judge, lambda: _prepare_pending(judge, jobs, progress, bar, 2 * args.max_concurrency, finished),
                finished, len(rows))
        except PrepareBudgetSpent as spent:
            budget_spent = spent  # the rows prepared so far are written below
        finally:
            judge.close()  # stop the judge's connections before the progress file closes under it
    stats = judge.stats.snapshot()
    print(f"prepare: judge calls {stats['calls']:g}, cache hits {stats['cache_hits']:g}, retries {stats['retries']:g}, "
          f"failures {stats['failures']:g}, tokens {stats['prompt_tokens']:g}+{stats['completion_tokens']:g}, "
          f"cost ${stats['cost']:.4f}" + (f" ({stats['cost_unknown']:g} answers unpriced)" if stats["cost_unknown"] else ""))

    for failure in failures.values():
        failure["retry"] = failure["kind"] not in (NO_ANSWER, INVALID_ROW) and not (
            failure["kind"] == REQUEST_ERROR and _REFUSED_BY_JUDGE.search(failure["reason"]))
    failures_path = os.path.join(work_dir, FAILURES_FILE)
    with open(failures_path, "w", encoding="utf-8") as handle:
        for index in sorted(failures):
            handle.write(json.dumps({"index": index, **failures[index]}, ensure_ascii=False) + "\n")
    never = {index: failure for index, failure in failures.items() if not failure["retry"]}
    retry = {index: failure for index, failure in failures.items() if failure["retry"]}
    done = read_progress(progress_path, meta)
    if budget_spent is not None:
        if done:
            _write_prepared(args, dataset, rows, prompts, references, answers, done)
        raise budget_spent
    if never:
        print(f"prepare: leaving out {len(never)} row(s) that can never be prepared as they are ({_summary(never)}): "
              f"fix them in {args.dataset} to include them; listed in {failures_path}")
    if retry and not args.drop_invalid:
        first = min(retry)
        raise PrepareFailed(f"the judge could not prepare {len(retry)} row(s) this time ({_summary(retry)}; first, row "
                            f"{first}: {retry[first]['reason']}). Rerun the same command to retry only those rows "
                            "(finished rows are kept), or add --drop-invalid to write the dataset without them; all "
                            f"rows not prepared are listed in {failures_path}")
    if retry:
        print(f"prepare: leaving out {len(retry)} row(s) the judge could not prepare ({_summary(retry)}; "
              f"--drop-invalid; listed in {failures_path})")
    return _write_prepared(args, dataset, rows, prompts, references, answers, done)


def _write_prepared(args: argparse.Namespace, dataset, rows, prompts, references, answers, done):
    """Save (or push) the input rows prepared so far, with the written columns; returns that dataset."""
    from datasets import List, Value

    keep = [index for index in range(len(rows)) if index in done]
    if not keep:
        raise PrepareFailed("no row could be prepared, so no dataset is written; the reasons are in "
                            f"{os.path.join(work_dir_of(args), FAILURES_FILE)}")
    prepared = dataset.select(keep) if len(keep) != len(rows) else dataset
    written = {
        "prompt": [prompts[i] for i in keep],
        "answer": [answers[i] for i in keep],
        # The same rule as `train --reference_column` on the raw file: a GSM8K `#### 72` line becomes `\boxed{72}`
        # (ARG needs the final-answer marker in the reference; PAPO's judge reads it as the answer).
        "reference": [boxed_reference(references[i]) for i in keep],
    }
    for column in WRITTEN_COLUMNS:
        if column in prepared.column_names and prepared[column] == written[column]:
            prepared = prepared.remove_columns(column)  # the same values, written back below: nothing to report
        elif column in prepared.column_names:
            kept_as = f"original_{column}"
            prepared = prepared.rename_column(column, kept_as)
            print(f"prepare: the input column {column!r} is replaced by {_WRITTEN_HELP[column]}; its values are kept "
                  f"as {kept_as!r}")
        prepared = prepared.add_column(column, written[column])
    for column in ("reasoning_points", "reasoning_graph"):
        if column in prepared.column_names:
            print(f"prepare: replacing the existing column {column!r}")
            prepared = prepared.remove_columns(column)
    prepared = prepared.add_column("reasoning_points", [done[i]["reasoning_points"] for i in keep],
                                   feature=List(Value("string")))
    graph_feature = List({"if_all": List(Value("int64")), "makes_obsolete": List(Value("int64"))})
    prepared = prepared.add_column("reasoning_graph", [done[i]["reasoning_graph"] for i in keep], feature=graph_feature)
    if args.push_to_hub:
        prepared.push_to_hub(args.push_to_hub, private=args.private, split=args.split)
        print(f"prepare: pushed {len(prepared)} rows to the Hub dataset {args.push_to_hub}")
    else:
        prepared.save_to_disk(args.out)
        print(f"prepare: wrote {len(prepared)} rows to {args.out}")
    return prepared


_WRITTEN_HELP = {"prompt": "the conversational problem", "answer": "the gold final answers",
                 "reference": "the reference solutions"}


def _conversational(cell: Any, problem: str) -> list[dict[str, str]]:
    """The `prompt` a trainer takes: a chat cell up to its last user turn (a reply after it is the solution, never
    a prompt), plain text as one user message."""
    return chat_prompt(cell) if is_chat(cell) else [{"role": "user", "content": problem}]


# `train`/`eval` spellings a user brings to `prepare`: named, not guessed.
PREPARE_RENAMED = {"--dataset-name": "--dataset", "--dataset-train-split": "--split", "--output-dir": "--out",
                   "--out-dir": "--out", "--judge-api-base": "--api-base"}


def normalize_flags(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--problem_column` (train's spelling) is read as `--problem-column`; an unknown flag is a ValueError with
    the closest known flags, before anything is loaded."""
    from ppm_trl.cli import check_flags

    known = parser._option_string_actions
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        dashed = flag.replace("_", "-")
        if arg.startswith("--") and flag not in known and (dashed in known or dashed in PREPARE_RENAMED):
            arg = dashed + eq + value
        out.append(arg)
    check_flags(out, parser, "prepare", PREPARE_RENAMED)
    return out



def judge_cache_dir(flag: str | None, work_dir: str) -> str | None:
    """The judge cache of `--cache-dir`: `<work dir>/judge_cache` when the flag is not given (a rerun, or a second
    `prepare` on the same work dir, pays for nothing twice), none for `--cache-dir none`, else the path given."""
    if flag is None:
        return os.path.join(work_dir, "judge_cache")
    return None if flag.strip().lower() == "none" else flag


def main(argv: list[str] | None = None) -> None:
    parser = add_prepare_arguments(argparse.ArgumentParser(
        prog="ppm-trl prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(normalize_flags(list(sys.argv[1:] if argv is None else argv), parser))
    try:
        run_prepare(args)
    except PrepareInterrupted as interrupted:
        print(f"\nppm-trl prepare: {interrupted}", file=sys.stderr)
        raise SystemExit(130) from None
    except KeyboardInterrupt:
        print("\nppm-trl prepare: interrupted; rerun the same command to resume", file=sys.stderr)
        raise SystemExit(130) from None
    except PrepareBudgetSpent as spent:
        from ppm_trl.cli import JUDGE_BUDGET_EXIT_CODE

        print(f"ppm-trl prepare: {spent}", file=sys.stderr)
        raise SystemExit(JUDGE_BUDGET_EXIT_CODE) from None
    except PrepareFailed as failed:
        print(f"ppm-trl prepare: {failed}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main(sys.argv[1:])
