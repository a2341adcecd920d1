"""Your dataset's columns → the columns the trainers read, and every column requirement checked up front.

`map_columns` is the one train/eval-time mapping mechanism — it returns `(dataset, report)`, the mapped dataset and a
list of lines saying what it left out or cut: `problem_column` becomes a conversational `prompt`,
`answer_column` the gold final answer (`answer`), `reference_column` the worked solution (`reference`). A GSM8K
worked solution (`... #### 72`) gives the gold answer after `####`, a MATH one its last `\\boxed{}`.

`required_run_columns` lists what a method + its reward functions + its scorer read; `check_required_columns` raises
before any model is loaded, naming the dataset's own columns and the flag (or `ppm-trl prepare`) that fixes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .registry import get_method
from .reward_sources import reward_columns
from .text import last_boxed, normalize_boxes

_GSM8K_ANSWER = re.compile(r"^[ \t]*####[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")

# What fixes a missing column, shown in the error.
FIXES = {
    "prompt": "name the problem column with `--problem_column COLUMN` (it becomes a chat prompt)",
    "answer": "name the gold-answer column with `--answer_column COLUMN` (a bare answer, a GSM8K solution ending in "
              "`#### 72` or a solution with a final `\\boxed{}`), or run `ppm-trl prepare`, which writes `answer`",
    "reference": "name the worked-solution column with `--reference_column COLUMN`, or run `ppm-trl prepare`, which "
                 "writes `reference`",
    "reasoning_points": "run `ppm-trl prepare` on the dataset: it writes `reasoning_points` and `reasoning_graph` "
                        "from the reference solutions",
    "env": "the programmatic scorers and `env_*` rewards only work on the synthetic envs (`--env_name`); for your "
           "own data use the judge (`--progress_scorer judge` / `--process_scorer judge`) and `--reward_funcs accuracy`",
}
# The same fixes for a trainer built in Python (`ppm-trl prepare` has no Python API: it is named as the command).
PYTHON_FIXES = {
    "prompt": "name the problem column with `dataset, report = ppm_trl.columns.map_columns(dataset, "
              "problem_column=COLUMN)` (it becomes a chat prompt)",
    "answer": "name the gold-answer column with `dataset, report = ppm_trl.columns.map_columns(dataset, "
              "answer_column=COLUMN)` (a bare answer, a GSM8K solution ending in `#### 72` or a solution with a final "
              "`\\boxed{}`), or train on the output of the `ppm-trl prepare` command, which writes `answer`",
    "reference": "name the worked-solution column with `dataset, report = ppm_trl.columns.map_columns(dataset, "
                 "reference_column=COLUMN)`, or train on the output of the `ppm-trl prepare` command, which writes "
                 "`reference`",
    "reasoning_points": "run the `ppm-trl prepare` command on the dataset (a command, not a Python function): it writes "
                        "`reasoning_points` and `reasoning_graph` from the reference solutions; load its --out "
                        "directory with `datasets.load_from_disk`",
    "env": "the programmatic scorers and `env_*` rewards only work on the synthetic envs (`make_dataset`); for your "
           "own data use the judge (`progress_scorer=\"judge\"` / `process_scorer=\"judge\"`) and `accuracy_reward`",
}
# PAPO's programmatic process scorer reads points and env; its judge scorer needs neither, nor any prepare.
PAPO_JUDGE_FIX = {"cli": "`--process_scorer judge` scores with the judge, which reads only `reference` (no `ppm-trl "
                         "prepare` needed)",
                  "python": "`process_scorer=\"judge\"` scores with the judge, which reads only `reference` (no "
                            "`ppm-trl prepare` needed)"}


def column_fix(column: str, reader: str, spelling: str = "cli") -> str:
    """How to provide `column` for `reader` (who needs it), in the user's spelling: "cli" flags or "python"."""
    fix = (FIXES if spelling == "cli" else PYTHON_FIXES).get(column, "")
    if column in ("reasoning_points", "env") and "process_scorer" in reader:
        return f"{PAPO_JUDGE_FIX[spelling]}; or {fix}" if fix else PAPO_JUDGE_FIX[spelling]
    return fix


def gsm8k_answer(text: Any) -> str | None:
    """The answer on a GSM8K-style solution's last `#### 72` line (a trailing period and thousands separators
    dropped: `#### 1,234.` → `1234`); None without such a line. `ppm-trl prepare` and `train` both read it here."""
    found = _GSM8K_ANSWER.findall(text) if isinstance(text, str) else []
    if not found:
        return None
    answer = found[-1].rstrip(".").strip()
    return (answer.replace(",", "") if _THOUSANDS.fullmatch(answer) else answer) or None


def gold_answer(value: Any, solution: bool = False) -> str | None:
    """The gold final answer in a cell: its last `\\boxed{}` (`\\fbox{}` and `\\boxed 4` too), else a GSM8K
    `#### ` line, else — for a cell of a bare-answer column — the cell itself.

    None when the cell is empty, has a `\\boxed{` that is unclosed or empty and no `#### ` line, or is a worked
    solution (`solution=True`, see `is_solution_column`) with no final-answer marker: its last sentence is not an
    answer (`ppm-trl prepare` reads gold answers by the same rule).
    """
    text = normalize_boxes("" if value is None else str(value))
    if "\\boxed" in text:
        boxed = last_boxed(text)
        if boxed and boxed.strip():
            return boxed.strip()
        return gsm8k_answer(text)
    return gsm8k_answer(text) or (None if solution else text.strip() or None)


def is_solution_column(values: Sequence[Any]) -> bool:
    """Whether a column holds worked solutions rather than bare answers: at least half of its non-empty cells end
    in a GSM8K `#### x` line or hold a `\\boxed{}`. A cell of such a column without either has no gold answer."""
    texts = [normalize_boxes(v) for v in values if isinstance(v, str) and v.strip()]
    marked = sum(bool(_GSM8K_ANSWER.search(text)) or "\\boxed" in text for text in texts)
    return bool(texts) and 2 * marked >= len(texts)


def boxed_reference(value: Any) -> str:
    """A worked solution as ARG/PAPO read it: a GSM8K `#### 72` final line becomes `\\boxed{72}` (and `\\fbox{72}`,
    `\\boxed 72` become `\\boxed{72}`)."""
    text = normalize_boxes("" if value is None else str(value))
    if "\\boxed" in text:
        return text
    return _GSM8K_ANSWER.sub(lambda m: "\\boxed{" + gsm8k_answer(m.group(0)) + "}", text)


def is_chat(value: Any) -> bool:
    """A conversational cell: a non-empty list of {"role", "content"} messages."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in value))


def _last_user_turn(messages: list[dict], column: str, row: int) -> int:
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        raise ValueError(f"column {column!r}, row {row}: a chat without a user turn (roles "
                         f"{[m.get('role') for m in messages]}); the problem is read from the last user turn")
    return users[-1]


def chat_prompt(messages: list[dict], column: str = "prompt", row: int = 0) -> list[dict]:
    """The conversation up to and including its last user turn: the reply to it (the solution) is never prompt."""
    return list(messages[: _last_user_turn(messages, column, row) + 1])


def chat_reply(messages: list[dict], column: str = "messages", row: int = 0) -> str:
    """The text of the assistant turn(s) after the last user turn: the chat's worked solution."""
    replies = [m["content"] for m in messages[_last_user_turn(messages, column, row) + 1 :]
               if m.get("role") == "assistant" and isinstance(m["content"], str) and m["content"].strip()]
    if not replies:
        raise ValueError(f"column {column!r}, row {row}: no assistant turn after the last user turn (roles "
                         f"{[m.get('role') for m in messages]}), so no solution to read; name a column that "
                         "holds the solution")
    return "\n".join(replies)


def problem_of(value: Any, column: str, index: int) -> str:
    """Problem text of a plain or conversational (list of messages) cell, as `ppm-trl prepare` reads it."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        user = [m["content"] for m in value if m.get("role") == "user"]
        content = user[-1] if user else value[-1]["content"]
        if isinstance(content, str) and content.strip():
            return content
    raise ValueError(f"row {index}: column {column!r} must be non-empty text or a list of chat messages, got {value!r:.200}")


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


def row_answer(row: dict[str, Any], answer_column: str | None, reference_column: str, index: int = 0,
               solution_column: bool = False) -> tuple[str | None, str]:
    """(gold final answer or None, where it came from: the column name, 'boxed', 'gsm8k' or 'none'), as
    `ppm-trl prepare` reads a row: from `answer_column` as `train --answer_column` reads it (`gold_answer`: in a
    column of worked solutions, `solution_column`, a cell without `####` or `\\boxed{}` has none), else from the
    reference solution's last `\\boxed{}` (or `<answer>`), else its GSM8K `#### ` line."""
    from .judge.parsing import final_answer_of

    if answer_column is not None:
        value = row[answer_column]
        if is_chat(value):  # the assistant turn is a worked solution: its final answer, as for a reference
            reply = normalize_boxes(chat_reply(value, answer_column, index))
            answer = final_answer_of(reply) or gsm8k_answer(reply)
        else:
            answer = gold_answer(value, solution_column)
        return answer, (answer_column if answer is not None else "none")
    value = row[reference_column]
    reference = normalize_boxes(chat_reply(value, reference_column, index) if is_chat(value) else value)
    boxed = final_answer_of(reference)
    if boxed is not None:
        return boxed, "boxed"
    gsm8k = gsm8k_answer(reference)
    return (gsm8k, "gsm8k") if gsm8k is not None else (None, "none")


def conversational_prompt(cell: Any, problem: str) -> list[dict[str, str]]:
    """The `prompt` a trainer takes: a chat cell up to its last user turn (a reply after it is the solution, never
    a prompt), plain text as one user message."""
    return chat_prompt(cell) if is_chat(cell) else [{"role": "user", "content": problem}]


def map_columns(dataset, problem_column: str | None = None, answer_column: str | None = None,
                reference_column: str | None = None, source: str = "the dataset", invalid_rows: str = "error"):
    """(dataset with `prompt`/`answer`/`reference` built from the named columns, list of report lines).

    The `answer` column (named or already there) always goes through `gold_answer`, so a GSM8K `answer` column
    works as-is; in a column of worked solutions (`is_solution_column`, or the reference column itself) a cell
    without a final-answer marker has no gold answer. A named column that does not exist is a ValueError. A row
    that cannot be used — no gold answer, an empty problem or reference, a chat without a user turn or without an
    assistant reply — is a ValueError naming it (`invalid_rows="error"`), or is left out and listed in one report
    line (`invalid_rows="drop"`, what `ppm-trl train` and `eval` do).
    """
    if invalid_rows not in ("error", "drop"):
        raise ValueError(f"invalid_rows must be 'error' or 'drop', got {invalid_rows!r}")
    columns = list(dataset.column_names)
    check_named_columns(columns, [("--problem_column", problem_column), ("--answer_column", answer_column),
                                  ("--reference_column", reference_column)], source)
    check_flags_on_prepared_data(columns, problem_column, answer_column, reference_column, source)
    unusable: dict[int, str] = {}  # row -> why it cannot be used (invalid_rows="drop")

    def read(reader, value, row: int):
        """reader(value, row), or None for a row that cannot be used (recorded; raised with invalid_rows="error")."""
        try:
            return reader(value, row)
        except ValueError as error:
            if invalid_rows == "error":
                raise
            unusable.setdefault(row, str(error))
            return None

    # Read every source column before writing any: `--reference_column answer` + the `answer` gold both read `answer`.
    new: dict[str, list] = {}
    report: list[str] = []
    prompt_source = problem_column or ("prompt" if "prompt" in columns else None)
    if prompt_source is not None:
        cells = dataset[prompt_source]
        keep_as_is = prompt_source == "prompt" and problem_column is None
        prompts = [read(lambda v, i: chat_prompt(v, prompt_source, i) if is_chat(v) else v if keep_as_is else
                        [{"role": "user", "content": _text(v, prompt_source, i)}], v, i) for i, v in enumerate(cells)]
        cut = sum(is_chat(v) and p is not None and len(p) < len(v) for v, p in zip(cells, prompts))
        if cut:  # a chat's reply to its last user turn is the solution: training on it as prompt would leak it
            report.append(f"prompts from the chats in column {prompt_source!r}: {cut} of {len(cells)} end with a reply "
                          "after the last user turn, left out of the prompt")
        if problem_column is not None or cut:
            new["prompt"] = prompts
    reference_source = reference_column or ("reference" if "reference" in columns else None)
    references = _replies(dataset[reference_source], reference_source, read) if reference_source else []
    if reference_column is not None:
        texts = [None if i in unusable else read(lambda v, i: _text(v, reference_column, i), v, i)
                 for i, v in enumerate(references)]
        new["reference"] = [None if text is None else boxed_reference(text) for text in texts]
    elif "reference" in columns and (references != dataset["reference"] or any(
            isinstance(v, str) and v != boxed_reference(v) for v in references)):  # chats, GSM8K lines, box spellings
        new["reference"] = [boxed_reference(v) if isinstance(v, str) else v for v in references]
    if "reference" in new:
        converted = sum(a is not None and a != b for a, b in zip(references, new["reference"]))
        if converted:
            report.append(f"references: {converted} GSM8K `#### x` final lines read as `\\boxed{{x}}`")
    answer_source = answer_column or ("answer" if "answer" in columns else None)
    if answer_source is not None:
        raw = dataset[answer_source]
        values = _replies(raw, answer_source, read)
        # Worked solutions (a chat's reply, the reference itself, a GSM8K/MATH column): the marker is the answer.
        solution = (answer_source == reference_source or any(is_chat(v) for v in raw)
                    or is_solution_column(values))
        golds = [gold_answer(v, solution) if i not in unusable else None for i, v in enumerate(values)]
        missing = [i for i, g in enumerate(golds) if g is None and i not in unusable]
        if missing and invalid_rows == "error":
            raise ValueError(
                f"column {answer_source!r} of {source}: no gold answer in {len(missing)} of {len(golds)} rows "
                f"(first: row {missing[0]}, {str(values[missing[0]])[:80]!r}); a cell must be the answer, end in a "
                "GSM8K `#### <answer>` line or contain a closed `\\boxed{<answer>}`")
        for i in missing:
            unusable[i] = (f"column {answer_source!r}, row {i}: no gold answer (no GSM8K `#### <answer>` line, no "
                           f"closed `\\boxed{{<answer>}}`) in {str(values[i])[:60]!r}")
        # Counted over the rows that had a gold answer (a row left out for another reason, e.g. an empty question
        # beside a valid `#### 4`, is in none of the counts: it made "as written" negative).
        found = [str(values[i]) for i, g in enumerate(golds) if g is not None]
        gsm8k = sum(bool(_GSM8K_ANSWER.search(v)) for v in found)
        boxed = sum("\\boxed" in normalize_boxes(v) and not _GSM8K_ANSWER.search(v) for v in found)
        if gsm8k or boxed:
            none = len(missing)
            report.append(f"gold answers from column {answer_source!r}: {gsm8k} GSM8K-style (`#### x`), "
                          f"{boxed} from the last \\boxed{{}}, {len(found) - gsm8k - boxed} as written"
                          + (f", {none} without one" if none else ""))
        if answer_source != "answer" or golds != list(values):  # an `answer` that is all gold stays as it is
            new["answer"] = golds
    if unusable:
        if len(unusable) == len(dataset):
            first = min(unusable)
            raise ValueError(f"no row of {source} can be used (first, row {first}: {unusable[first]})")
        keep = [i for i in range(len(dataset)) if i not in unusable]
        dataset = dataset.select(keep)
        new = {column: [values[i] for i in keep] for column, values in new.items()}
        shown = "; ".join(unusable[i] for i in sorted(unusable)[:3]) + ("; ..." if len(unusable) > 3 else "")
        report.append(f"left out {len(unusable)} of {len(keep) + len(unusable)} rows that cannot be used "
                      f"(row{'s' * (len(unusable) > 1)} {_row_list(sorted(unusable))}): {shown}")
    for column, values in new.items():
        if column in dataset.column_names:
            dataset = dataset.remove_columns(column)
        dataset = dataset.add_column(column, values)
    return dataset, report


# What `ppm-trl prepare` writes in each column (the input's own columns of those names are kept as `original_*`).
PREPARED_COLUMNS = {"prompt": "the problems as chat prompts", "answer": "the gold final answers",
                    "reference": "the worked solutions"}
# Each column flag's own column, and the prepared columns it may name (`--answer_column reference` reads each worked
# solution's last \boxed{}: the gold answer).
_FLAG_COLUMN = {"--problem_column": "prompt", "--answer_column": "answer", "--reference_column": "reference"}
_FLAG_READS = {"--problem_column": ("prompt",), "--answer_column": ("answer", "reference"),
               "--reference_column": ("reference",)}


def check_named_columns(columns: Sequence[str], named: Sequence[tuple[str, str | None]], source: str) -> None:
    """Each column a flag names (`(flag, column)`; None: not named) must be one of `columns`: a ValueError naming the
    flag, the column and the dataset's columns (`train`/`eval`'s `--problem_column`, `prepare`'s
    `--problem-column`)."""
    for flag, column in named:
        if column is not None and column not in columns:
            role = next((role for role in _LIKELY_COLUMNS if role in flag), None)
            likely = [c for c in _LIKELY_COLUMNS.get(role, ()) if c in columns and c != column]
            hint = f"; did you mean {flag} {likely[0]}?" if likely else ""
            raise ValueError(f"{flag} {column!r} is not a column of {source}; its columns are {list(columns)}{hint}")


# The names a role's column usually has (GSM8K, MATH, chat datasets), most likely first: the hint of a wrong flag.
_LIKELY_COLUMNS = {"problem": ("problem", "question", "prompt", "query", "instruction", "input", "messages"),
                   "reference": ("solution", "reference", "answer", "response", "output", "messages"),
                   "answer": ("answer", "final_answer", "gold", "target")}


def is_prepared(columns: Sequence[str]) -> bool:
    """A dataset written by `ppm-trl prepare`: its reasoning points and graph next to the columns it writes."""
    return {"reasoning_points", "reasoning_graph", *PREPARED_COLUMNS} <= set(columns)


def check_flags_on_prepared_data(columns: Sequence[str], problem_column: str | None, answer_column: str | None,
                                 reference_column: str | None, source: str) -> None:
    """On prepared data, a column flag that names a prepared column of another role (`--reference_column answer`:
    `answer` now holds the gold answers, not solutions) is a ValueError naming the flag and the user's column —
    not a later error about the column it was copied into."""
    if not is_prepared(columns):
        return
    for flag, column in (("--problem_column", problem_column), ("--answer_column", answer_column),
                         ("--reference_column", reference_column)):
        if column in PREPARED_COLUMNS and column not in _FLAG_READS[flag]:
            role, kept = _FLAG_COLUMN[flag], f"original_{column}"
            raise ValueError(
                f"{flag} {column!r}: {source} was written by `ppm-trl prepare`, so its column {column!r} holds "
                f"{PREPARED_COLUMNS[column]}, and {PREPARED_COLUMNS[role]} are in {role!r}, read without a flag: drop "
                f"{flag}" + (f" (your input's own {column!r} column is kept as {kept!r}: name that)"
                             if kept in columns else ""))


def _row_list(rows: list[int], shown: int = 10) -> str:
    return ", ".join(map(str, rows[:shown])) + (f" and {len(rows) - shown} more" if len(rows) > shown else "")


def _replies(values: list, column: str, read=lambda reader, value, row: reader(value, row)) -> list:
    """A chat column read as its solutions (the reply to the last user turn); other columns as they are. `read`
    applies the reader to one cell (`map_columns` records an unusable row there instead of raising)."""
    return [read(lambda v, i: chat_reply(v, column, i) if is_chat(v) else v, v, i) for i, v in enumerate(values)]


def _text(value: Any, column: str, row: int) -> str:
    if not isinstance(value, str) or not value.strip():
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ValueError(f"column {column!r}, row {row}: expected a non-empty string or a chat (a list of "
                         f"{{'role', 'content'}} messages), got {type(value).__name__} {shown}")
    return value


def required_run_columns(method: str, reward_funcs: Sequence[str], training_args) -> dict[str, str]:
    """Column → who reads it, for a method, its reward functions (by CLI name) and its scorer (the registries in
    `ppm_trl.methods` say which)."""
    needs = {"prompt": "every method"}
    for name in reward_funcs:
        for column in reward_columns(name):
            needs.setdefault(column, f"the `{name}` reward")
    for column, need in get_method(method).required_columns(training_args).items():
        needs.setdefault(column, need.reader)
    return needs


def check_required_columns(dataset, needs: Mapping[str, str], source: str = "the dataset", spelling: str = "cli",
                           kinds: Mapping[str, str] | None = None) -> None:
    """The one column check, for the commands and the trainers: every column of `needs` (column → who reads it) must
    be in `dataset` (in each split of a DatasetDict; None is not checked). With `kinds` (column → "str": a non-empty
    string, "list": a non-empty list of non-empty strings, "any") every cell of a dataset with a length must be of
    its kind (an iterable dataset: only its column names).

    `spelling="cli"` (the commands): one ValueError listing every missing column, who needs it, the dataset's own
    columns and the flag that fixes it. `spelling="python"` (a trainer built in Python): a ValueError for the first
    missing column or bad cell, with the fix in Python."""
    if dataset is None:
        return
    for split in dataset.values() if isinstance(dataset, dict) else [dataset]:
        columns = list(getattr(split, "column_names", None) or [])
        missing = [column for column in needs if column not in columns]
        if missing and spelling == "cli":
            lines = [f"{source} lacks column(s) {', '.join(repr(c) for c in missing)}; its columns are {columns}."]
            for column in missing:
                hint = column_fix(column, needs[column])
                guess = _guess(column, columns)
                lines.append(f"  - {column!r} (needed by {needs[column]}): {hint}"
                             + (f"; perhaps {guess}" if guess else ""))
            raise ValueError("\n".join(lines))
        for column, reader in needs.items():
            if column not in columns:
                raise ValueError(
                    f"{reader} needs the `{column}` column in the dataset; the dataset's columns are {sorted(columns)}. "
                    f"Fix: {column_fix(column, reader, 'python') or 'see the dataset format in the README'}.")
            if kinds and hasattr(split, "__len__"):
                for row, value in enumerate(split[column]):
                    problem = _cell_problem(value, kinds.get(column, "any"))
                    if problem:
                        raise ValueError(f"{reader}: column `{column}`, row {row}: {problem}")


def _cell_problem(value: Any, kind: str) -> str | None:
    if kind == "str" and (not isinstance(value, str) or not value.strip()):
        return f"expected a non-empty string, got {value!r:.80}"
    if kind == "list":
        if not isinstance(value, (list, tuple)) or not value:
            return f"expected a non-empty list of strings, got {value!r:.80}"
        if any(not isinstance(v, str) or not v.strip() for v in value):
            return "every item must be a non-empty string"
    return None


def _guess(column: str, columns: list[str]) -> str | None:
    flag = {"prompt": "--problem_column", "answer": "--answer_column", "reference": "--reference_column"}.get(column)
    candidates = {"prompt": ("problem", "question", "query", "input", "messages"),
                  "answer": ("final_answer", "solution", "target", "label", "messages"),
                  "reference": ("solution", "answer", "rationale", "reference_solution", "messages")}.get(column, ())
    name = next((name for name in candidates if name in columns), None)
    return f"`{flag} {name}`" if name else None
