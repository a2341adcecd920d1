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
A dataset that already has points and graphs (the PPM paper's Polaris data) is read with `--points-column` /
`--graph-column` instead, with no judge call (`given_points.py`; README "Recipes").

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
import json
import os
import re
import signal
import sys
import threading
from typing import Any

from ppm_trl.columns import (
    boxed_reference,
    check_named_columns,
    conversational_prompt,
    is_solution_column,
    problem_of,
    reference_of,
    row_answer,
)
from ppm_trl.data import FAILURES_FILE, PROGRESS_FILE, load_data
from ppm_trl.flags import JUDGE_BUDGET_EXIT_CODE, dashed_flags
from ppm_trl.judge.arguments import (
    PREPARE_ALIASES,
    TRAINING_ONLY,
    JudgeArguments,
    add_judge_arguments,
    build_judge,
    judge_arguments,
)
from ppm_trl.judge.settings import judge_cache_dir as _cache_rule
from ppm_trl.judge.tasks import REQUEST_ERROR
from ppm_trl.prepare.given_points import BAD_GIVEN_POINTS, given_points_settings, read_given_points
from ppm_trl.prepare.hub_card import dataset_card
from ppm_trl.prepare.judging import (
    PrepareBudgetSpent,
    PrepareFailed,
    PrepareInterrupted,
    _in_prepare_spelling,
    _prepare_pending,
    _run_interruptibly,
    duplicate_groups,
    row_fingerprint,
)

NO_ANSWER = "no_answer"  # failure kind of a row whose gold answer cannot be found (no judge call is spent on it)
INVALID_ROW = "invalid_row"  # an empty problem or reference, a chat without a user turn or an assistant reply
# A judge that refuses the row itself (HTTP 4xx, e.g. longer than its context) refuses it again on every rerun.
_REFUSED_BY_JUDGE = re.compile(r"\(HTTP 4\d\d\)")
WRITTEN_COLUMNS = ("prompt", "answer", "reference")
# `prepare`'s own defaults and help for some judge flags (the rest are the training fields'; see `add_judge_arguments`).
JUDGE_DEFAULTS = {"judge_model": None, "judge_timeout": 120.0}  # required unless --points-column (run_prepare)
JUDGE_HELP = {
    "judge_model": "LiteLLM model string, e.g. gemini/gemini-2.5-flash-lite (required unless --points-column).",
    "judge_api_base": "Server URL for self-hosted judges (vLLM, SGLang).",
    "judge_max_concurrency": "Judge requests in flight at once.",
    "judge_timeout": "Seconds per judge attempt.",
    "judge_cache_dir": "Judge answer cache (default: <work dir>/judge_cache; `none`: no cache).",
    "judge_max_rpm": "Judge requests per minute at most (a quota).",
    "judge_max_tpm": "Judge tokens per minute at most (a quota).",
    "judge_max_cost_usd": "Stop starting rows once the judge has cost this much (finished rows are kept).",
    "judge_max_total_tokens": "Stop starting rows once the judge has used this many tokens (finished rows are kept).",
    "judge_echo_nonce": "Make the judge echo a per-request nonce; refuse answers without it.",
    "judge_probe": "Send one tiny request that checks the judge (key, model, server) before any work "
                   "(--no-judge-probe: skip it).",
}


def add_prepare_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", required=True,
                      help="Hub dataset id, a directory written by save_to_disk, or a .json/.jsonl/.parquet/.csv/.arrow file.")
    data.add_argument("--split", default="train", help="Split to prepare (Hub datasets and DatasetDicts).")
    data.add_argument("--config-name", default=None, help="Hub dataset configuration name.")
    data.add_argument("--reference-column", required=True, help="Column with the reference solution text.")
    data.add_argument("--problem-column", default="prompt",
                      help="Column with the problem: plain text or a conversational prompt (last user message); "
                           "default: %(default)s (MATH-style files: problem; GSM8K: question).")
    data.add_argument("--answer-column", default=None,
                      help="Column with the gold final answer (default: extracted from the reference solution: its "
                           "last \\boxed{}, else a GSM8K '#### ' line).")
    data.add_argument("--limit", type=int, default=None, help="Prepare only the first N rows.")
    data.add_argument("--points-column", default=None,
                      help="Column with reasoning points the dataset already has (a list of strings, or numbered "
                           "lines '1. ...'): read instead of asking the judge, no judge call (the PPM paper's "
                           "Polaris data: rubric). A final-answer point is appended where the last one does not "
                           "state the gold answer.")
    data.add_argument("--graph-column", default=None,
                      help="With --points-column: column with the obsoletion graph (records, or pairs such as "
                           "'[([2], [1])]'; the Polaris data: makes_obsolete_dense). Default: no rules.")
    add_judge_arguments(parser.add_argument_group("judge"), PREPARE_ALIASES, JUDGE_DEFAULTS, JUDGE_HELP, TRAINING_ONLY)
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
    return parser


def prepare_parser(prog: str = "ppm-trl prepare", description: str | None = __doc__) -> argparse.ArgumentParser:
    """`prepare`'s flags: the data, the judge (`JudgeArguments`' fields) and the output."""
    return add_prepare_arguments(argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter))


def load_rows(args: argparse.Namespace):
    """The dataset split named by the arguments (a `datasets.Dataset`; `data.load_data`), its first --limit rows."""
    loaded = load_data(args.dataset, args.config_name, args.split, "--split", lambda line: print(f"prepare: {line}"))
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        loaded = loaded.select(range(min(args.limit, len(loaded))))
    return loaded


def judge_settings(args: argparse.Namespace) -> JudgeArguments:
    """The judge settings of the parsed flags, checked: a ValueError names the flag (`--timeout must be > 0`)."""
    if args.graph_column is not None:
        raise ValueError("--graph-column needs --points-column: the graph's item numbers refer to those points")
    if args.judge_model is None:
        raise ValueError("--judge-model is required: the LiteLLM model that writes the reasoning points and graphs "
                         "(e.g. gemini/gemini-2.5-flash-lite), unless the dataset already has them: --points-column "
                         "COLUMN [--graph-column COLUMN]")
    try:
        return judge_arguments(args)
    except ValueError as error:
        raise ValueError(_in_prepare_spelling(str(error))) from None


def check_prepare_columns(dataset, args: argparse.Namespace) -> None:
    check_named_columns(dataset.column_names, [("--reference-column", args.reference_column),
                                               ("--problem-column", args.problem_column),
                                               ("--answer-column", args.answer_column),
                                               ("--points-column", args.points_column),
                                               ("--graph-column", args.graph_column)], args.dataset)


def work_dir_of(args: argparse.Namespace) -> str:
    if args.work_dir:
        return args.work_dir
    if args.out:
        return args.out
    return os.path.join("ppm_trl_prepare", re.sub(r"[^\w.-]+", "_", args.push_to_hub))


def read_progress(path: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Finished rows of an earlier run with the same settings (a torn last line from an interruption is ignored;
    a record without a whole-number index >= 0 is not a finished row). `matching_progress` then keeps the records
    whose row still reads the same."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    done: list[dict[str, Any]] = []
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
        index = record.get("index") if isinstance(record, dict) else None
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            continue  # {"index": 1e400}, null, "3": not written by prepare; that row is judged again
        done.append(record)
    return done


def matching_progress(done: list[dict[str, Any]], fingerprints: list[str | None]) -> tuple[dict, int]:
    """({row index: the record judged from exactly that row's content}, records that match no row now). Matched by
    content, not by index: a row deleted, inserted or edited since shifts or changes what an index means, so a
    record is never attached to another row — and a row that only moved keeps its record (no judge call)."""
    by_content = {record["row"]: record for record in done if isinstance(record.get("row"), str)}
    kept = {index: by_content[fingerprint] for index, fingerprint in enumerate(fingerprints)
            if fingerprint is not None and fingerprint in by_content}
    used = {fingerprints[index] for index in kept}
    return kept, sum(record.get("row") not in used for record in done)


def answer_of(row: dict[str, Any], args: argparse.Namespace, index: int = 0,
              solution_column: bool = False) -> tuple[str | None, str]:
    """(gold final answer or None, where it came from: the column name, 'boxed', 'gsm8k' or 'none'); see
    `columns.row_answer`."""
    return row_answer(row, args.answer_column, args.reference_column, index, solution_column)


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


def _summary(failures: dict[int, dict[str, str]]) -> str:
    kinds = {NO_ANSWER: "without a final answer (no judge call)",
             INVALID_ROW: "with an empty problem or reference, or a chat without a user turn or an assistant reply",
             BAD_GIVEN_POINTS: "whose given points or graph cannot be read",
             REQUEST_ERROR: "with a judge request error", "unreadable": "with an unreadable judge answer"}
    counts = [f"{sum(f['kind'] == kind for f in failures.values())} {label}" for kind, label in kinds.items()
              if any(f["kind"] == kind for f in failures.values())]
    return ", ".join(counts)


def run_prepare(args: argparse.Namespace):
    """Prepare the dataset; returns the `datasets.Dataset` that was written."""
    from tqdm.auto import tqdm

    settings = given_points_settings(args) if args.points_column else judge_settings(args)  # before any data is read
    dataset = load_rows(args)
    check_prepare_columns(dataset, args)
    work_dir = work_dir_of(args)
    os.makedirs(work_dir, exist_ok=True)
    meta = {"dataset": args.dataset, "split": args.split, "config_name": args.config_name,
            "reference_column": args.reference_column, "problem_column": args.problem_column,
            "answer_column": args.answer_column, "judge_model": args.judge_model}
    progress_path = os.path.join(work_dir, PROGRESS_FILE)
    records = [] if settings is None else read_progress(progress_path, meta)  # checks the settings before any row
    rows = dataset.to_list()
    solution_column = args.answer_column is not None and (
        args.answer_column == args.reference_column or is_solution_column(dataset[args.answer_column]))
    # Each row read on its own: a row that can never be prepared is recorded (and left out), not fatal.
    problems, prompts, references, answers, sources = [], [], [], [], []
    failures: dict[int, dict[str, Any]] = {}
    for index, row in enumerate(rows):
        try:
            problem = problem_of(row[args.problem_column], args.problem_column, index)
            prompt = conversational_prompt(row[args.problem_column], problem)
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
    fingerprints = [None if index in failures else row_fingerprint(problems[index], references[index], answers[index])
                    for index in range(len(rows))]
    done, stale = matching_progress(records, fingerprints)
    if stale:
        print(f"prepare: {stale} record(s) of {progress_path} match no row as it reads now (rows were edited or "
              "removed since, or the record predates row checks): not used; rows without a record are judged")
    for index in done:
        failures.pop(index, None)  # prepared by an earlier run
    for column in WRITTEN_COLUMNS:  # refused now, not after the judge's work
        if column in dataset.column_names and f"original_{column}" in dataset.column_names:
            raise ValueError(f"the input has both {column!r} and 'original_{column}' columns: prepare writes its own "
                             f"{column!r} and keeps an input one as 'original_{column}'; rename or drop one of them")
    jobs = [(index, problems[index], references[index], answers[index])
            for index in range(len(rows)) if index not in done and index not in failures]
    if settings is None:
        done = read_given_points(args, rows, jobs, failures)
        failures_path = write_failures(work_dir, failures)
        if failures:
            print(f"prepare: leaving out {len(failures)} row(s) that can never be prepared as they are "
                  f"({_summary(failures)}): fix them in {args.dataset} to include them; listed in {failures_path}")
        return _write_prepared(args, dataset, rows, prompts, references, answers, done, failures)
    print(f"prepare: {len(rows)} rows, {len(done)} already done in {progress_path}, {len(jobs)} to prepare")
    duplicates = len(jobs) - len(duplicate_groups(jobs))
    if duplicates:
        print(f"prepare: {duplicates} row(s) repeat an earlier row's problem, reference and answer: each distinct "
              "row is judged once and its points are written to every copy")

    judge = build_judge(settings, work_dir)
    if jobs and settings.judge_probe:
        judge.probe()  # a judge that cannot answer fails here, before any row's work
    finished = [len(done)]  # rows in the progress file, for the Ctrl-C message
    budget_spent = None
    with open(progress_path, "a", encoding="utf-8") as progress, \
            tqdm(total=len(rows), initial=len(done) + len(failures), desc="prepare", disable=args.no_progress) as bar:
        if not os.path.getsize(progress_path):
            progress.write(json.dumps({"meta": meta}) + "\n")
        try:
            failures |= _run_interruptibly(
                judge, lambda: _prepare_pending(judge, jobs, progress, bar, 2 * settings.judge_max_concurrency, finished),
                finished, len(rows))
        except PrepareBudgetSpent as spent:
            budget_spent = spent  # the rows prepared so far are written below
        finally:
            judge.close()  # stop the judge's connections before the progress file closes under it
    stats = judge.stats.snapshot()
    print(f"prepare: judge calls {stats['calls']:g}, cache hits {stats['cache_hits']:g}, retries {stats['retries']:g}, "
          f"failures {stats['failures']:g}, tokens {stats['prompt_tokens']:g}+{stats['completion_tokens']:g}, "
          f"cost ${stats['cost']:.4f}" + (f" ({stats['cost_unknown']:g} answers unpriced)" if stats["cost_unknown"] else ""))

    failures_path = write_failures(work_dir, failures)
    never = {index: failure for index, failure in failures.items() if not failure["retry"]}
    retry = {index: failure for index, failure in failures.items() if failure["retry"]}
    done, _ = matching_progress(read_progress(progress_path, meta), fingerprints)
    if budget_spent is not None:
        if done:
            _write_prepared(args, dataset, rows, prompts, references, answers, done, failures)
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
    return _write_prepared(args, dataset, rows, prompts, references, answers, done, failures)


def write_failures(work_dir: str, failures: dict[int, dict[str, Any]]) -> str:
    """Mark each failure retryable or not and write them all to the failures file; returns its path."""
    for failure in failures.values():
        failure["retry"] = failure["kind"] not in (NO_ANSWER, INVALID_ROW, BAD_GIVEN_POINTS) and not (
            failure["kind"] == REQUEST_ERROR and _REFUSED_BY_JUDGE.search(failure["reason"]))
    failures_path = os.path.join(work_dir, FAILURES_FILE)
    with open(failures_path, "w", encoding="utf-8") as handle:
        for index in sorted(failures):
            handle.write(json.dumps({"index": index, **failures[index]}, ensure_ascii=False) + "\n")
    return failures_path


def _write_prepared(args: argparse.Namespace, dataset, rows, prompts, references, answers, done, failures=None):
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
        from huggingface_hub import DatasetCard

        prepared.push_to_hub(args.push_to_hub, private=args.private, split=args.split)
        reasons = _summary(failures) if failures else "none"
        DatasetCard(dataset_card(args, len(prepared), len(rows), reasons)).push_to_hub(args.push_to_hub)
        print(f"prepare: pushed {len(prepared)} rows and a dataset card to the Hub dataset {args.push_to_hub}")
    else:
        prepared.save_to_disk(args.out)
        print(f"prepare: wrote {len(prepared)} rows to {args.out}")
    return prepared


_WRITTEN_HELP = {"prompt": "the conversational problem", "answer": "the gold final answers",
                 "reference": "the reference solutions"}


# `train`/`eval` spellings a user brings to `prepare`: named, not guessed.
PREPARE_RENAMED = {"--dataset-name": "--dataset", "--dataset-train-split": "--split", "--output-dir": "--out",
                   "--out-dir": "--out"}


def normalize_flags(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--problem_column` (train's spelling) is read as `--problem-column`; an unknown flag is a UsageError with
    the closest known flags, before anything is loaded (`flags.dashed_flags`)."""
    return dashed_flags(argv, parser, "prepare", PREPARE_RENAMED)


def judge_cache_dir(flag: str | None, work_dir: str) -> str | None:
    """The judge cache of `--cache-dir`: `<work dir>/judge_cache` when the flag is not given (a rerun, or a second
    `prepare` on the same work dir, pays for nothing twice), none for `--cache-dir none`, else the path given
    (the rule of every judge: `judge.settings.judge_cache_dir`)."""
    return _cache_rule(flag, work_dir)


def main(argv: list[str] | None = None) -> None:
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A shell starts a background job (`ppm-trl prepare ... &`) with SIGINT ignored: `kill -INT` and a later
        # `fg` + Ctrl-C must still stop it cleanly, as they stop `train`.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = prepare_parser()
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
        print(f"ppm-trl prepare: {spent}", file=sys.stderr)
        raise SystemExit(JUDGE_BUDGET_EXIT_CODE) from None
    except PrepareFailed as failed:
        print(f"ppm-trl prepare: {failed}", file=sys.stderr)
        raise SystemExit(1) from None

