"""`ppm-trl prepare`: reasoning points and obsoletion graph for every row of a dataset (PPM paper App. D).

For each row the judge turns the reference solution into a rubric of reasoning points (whose last item must state
the final answer: the `answer` column when the dataset has one, else the reference's last `\\boxed{}` or
`<answer>`), then builds the obsoletion graph over those points, validated by `ReasoningGraph`. Finished rows are
appended to `prepare_progress.jsonl` in the output (or work) directory as they complete, so an interrupted run
resumes without redoing them; rows the judge could not do are listed in `prepare_failures.jsonl` and retried by
the next run. The result is the input dataset plus the columns `reasoning_points` (list[str]) and
`reasoning_graph` (list of {"if_all": [...], "makes_obsolete": [...]}, 1-based), saved with `save_to_disk` or
pushed to the Hub.

    ppm-trl prepare --dataset data.jsonl --reference-column solution --problem-column problem \\
        --judge-model gemini/gemini-2.5-flash-lite --out prepared/
    python -m ppm_trl.prepare ...   (same arguments)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from typing import Any

from ppm_trl.judge import LiteLLMJudge, final_answer_of
from ppm_trl.judge.transport import TRANSPORTS

PROGRESS_FILE = "prepare_progress.jsonl"
FAILURES_FILE = "prepare_failures.jsonl"
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
    data.add_argument("--answer-column", default="answer",
                      help="Gold final answer the last point must state, used when the column exists.")
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
    judge.add_argument("--cache-dir", default=None, help="Judge answer cache (default: <work dir>/judge_cache).")
    output = parser.add_argument_group("output")
    target = output.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", default=None, help="Directory for the prepared dataset (save_to_disk).")
    target.add_argument("--push-to-hub", default=None, help="Hub dataset id to push the prepared dataset to.")
    output.add_argument("--private", action="store_true", help="With --push-to-hub: create a private dataset.")
    output.add_argument("--work-dir", default=None,
                        help="Progress and cache directory (default: --out, or ./ppm_trl_prepare/<hub id>).")
    output.add_argument("--drop-invalid", action="store_true",
                        help="Write the dataset without the rows the judge could not prepare (default: fail).")
    output.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")
    return parser


def load_rows(args: argparse.Namespace):
    """The dataset split named by the arguments (a `datasets.Dataset`)."""
    import datasets

    path = args.dataset
    extension = os.path.splitext(path)[1].lower()
    if os.path.isdir(path):
        loaded = datasets.load_from_disk(path)
        if isinstance(loaded, datasets.DatasetDict):
            if args.split not in loaded:
                raise ValueError(f"--split {args.split!r} is not in {path}; available splits: {sorted(loaded)}")
            loaded = loaded[args.split]
    elif os.path.isfile(path) and extension in _DATA_FILE_FORMATS:
        loaded = datasets.load_dataset(_DATA_FILE_FORMATS[extension], data_files=path, split="train")
    elif os.path.exists(path):
        raise ValueError(f"--dataset {path!r}: unsupported file type; accepted: a save_to_disk directory or "
                         f"{sorted(_DATA_FILE_FORMATS)}")
    else:
        loaded = datasets.load_dataset(path, args.config_name, split=args.split)
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


def check_columns(dataset, args: argparse.Namespace) -> None:
    for flag, column in (("--reference-column", args.reference_column), ("--problem-column", args.problem_column)):
        if column not in dataset.column_names:
            raise ValueError(f"{flag} {column!r} is not a column of {args.dataset}; columns: {dataset.column_names}")
    for index, reference in enumerate(dataset[args.reference_column]):
        if not isinstance(reference, str) or not reference.strip():
            raise ValueError(f"row {index}: column {args.reference_column!r} must be a non-empty reference solution "
                             f"text, got {reference!r:.200}")


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


def _answer_of(row: dict[str, Any], args: argparse.Namespace) -> str | None:
    answer = row.get(args.answer_column)
    if answer is not None and str(answer).strip():
        return str(answer).strip()
    return final_answer_of(row[args.reference_column])


async def _prepare_pending(judge: LiteLLMJudge, jobs, progress, bar, window: int) -> dict[int, str]:
    """Points then graph for each pending row, appending each finished row to the progress file."""
    slots = asyncio.Semaphore(window)
    failures: dict[int, str] = {}

    async def one(index: int, problem: str, reference: str, answer: str | None) -> None:
        async with slots:
            points = await judge.agenerate_points(problem, reference, answer)
            if points is None:
                failures[index] = ("no readable <rubric> whose last point states the final answer "
                                   f"{answer!r}" if answer else "no readable <rubric>")
            else:
                graph = await judge.agenerate_graph(problem, points)
                if graph is None:
                    failures[index] = "no valid <makes_obsolete_graph> over the points"
                else:
                    record = {"index": index, "reasoning_points": points, "reasoning_graph": graph}
                    progress.write(json.dumps(record, ensure_ascii=False) + "\n")
                    progress.flush()
        bar.update(1)

    await asyncio.gather(*(one(*job) for job in jobs))
    return failures


def run_prepare(args: argparse.Namespace):
    """Prepare the dataset; returns the `datasets.Dataset` that was written."""
    from datasets import List, Value
    from tqdm.auto import tqdm

    dataset = load_rows(args)
    check_columns(dataset, args)
    work_dir = work_dir_of(args)
    os.makedirs(work_dir, exist_ok=True)
    meta = {"dataset": args.dataset, "split": args.split, "config_name": args.config_name,
            "reference_column": args.reference_column, "problem_column": args.problem_column,
            "judge_model": args.judge_model}
    progress_path = os.path.join(work_dir, PROGRESS_FILE)
    done = read_progress(progress_path, meta)
    rows = dataset.to_list()
    jobs = [(index, problem_of(row[args.problem_column], args.problem_column, index), row[args.reference_column],
             _answer_of(row, args)) for index, row in enumerate(rows) if index not in done]
    print(f"prepare: {len(rows)} rows, {len(done)} already done in {progress_path}, {len(jobs)} to prepare")

    judge = LiteLLMJudge(args.judge_model, api_base=args.api_base, max_concurrency=args.max_concurrency,
                         timeout=args.timeout, num_retries=args.num_retries, temperature=args.temperature,
                         cache_dir=args.cache_dir or os.path.join(work_dir, "judge_cache"),
                         api_key_env=args.api_key_env, transport=args.transport)
    with open(progress_path, "a", encoding="utf-8") as progress, \
            tqdm(total=len(rows), initial=len(done), desc="prepare", disable=args.no_progress) as bar:
        if not done:
            progress.write(json.dumps({"meta": meta}) + "\n")
        try:
            failures = judge.run(lambda: _prepare_pending(judge, jobs, progress, bar, 2 * args.max_concurrency))
        finally:
            judge.close()  # stop the judge's loop before the progress file closes under it
    stats = judge.stats.snapshot()
    print(f"prepare: judge calls {stats['calls']:g}, cache hits {stats['cache_hits']:g}, retries {stats['retries']:g}, "
          f"failures {stats['failures']:g}, tokens {stats['prompt_tokens']:g}+{stats['completion_tokens']:g}, "
          f"cost ${stats['cost']:.4f}" + (f" ({stats['cost_unknown']:g} answers unpriced)" if stats["cost_unknown"] else ""))

    failures_path = os.path.join(work_dir, FAILURES_FILE)
    with open(failures_path, "w", encoding="utf-8") as handle:
        for index in sorted(failures):
            handle.write(json.dumps({"index": index, "reason": failures[index]}) + "\n")
    if failures and not args.drop_invalid:
        first = ", ".join(f"row {i}: {failures[i]}" for i in sorted(failures)[:5])
        raise RuntimeError(f"{len(failures)} row(s) could not be prepared ({first}; all in {failures_path}). Rerun to "
                           "retry only those rows (finished rows are kept), or pass --drop-invalid to leave them out.")
    if failures:
        print(f"prepare: dropping {len(failures)} row(s) the judge could not prepare (listed in {failures_path})")

    done = read_progress(progress_path, meta)
    keep = [index for index in range(len(rows)) if index in done]
    prepared = dataset.select(keep) if len(keep) != len(rows) else dataset
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


def main(argv: list[str] | None = None) -> None:
    parser = add_prepare_arguments(argparse.ArgumentParser(
        prog="ppm-trl prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    run_prepare(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
