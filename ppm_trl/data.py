"""Loading a command's data, one way for `train`, `eval` and `prepare`: a data file is checked before `datasets`
reads it (an empty file, non-UTF-8 text or a broken JSON line is named with its line), a name is resolved as a
local file or `save_to_disk` directory, else as a Hub dataset (`looks_local` decides when a name cannot be a Hub
id), and the columns a run reads are mapped and checked before any model is loaded (`prepare_dataset`, with
`ppm_trl.columns`). Every problem is one `UsageError`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from .flags import UsageError, first_line

# What `datasets` reads each data file as.
DATA_FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
DATA_FILE_EXTENSIONS = tuple(DATA_FILE_FORMATS)
# What `ppm-trl prepare` keeps in its output (or work) directory while it runs.
PROGRESS_FILE = "prepare_progress.jsonl"
FAILURES_FILE = "prepare_failures.jsonl"


def looks_local(name: str) -> bool:
    """A path rather than a Hub id (`org/name`): ./x, /x, ~/x, a/b/c, or a data file name such as x.jsonl."""
    return (name.startswith((".", "/", "~")) or name.count("/") >= 2
            or os.path.splitext(name)[1].lower() in DATA_FILE_EXTENSIONS)


def offline_note() -> str:
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE",
                                                                                     "HF_DATASETS_OFFLINE"))
    return " (HF_HUB_OFFLINE is set: only local files and the Hub cache are read)" if offline else ""


def check_data_file(path: str) -> None:
    """An empty file, non-UTF-8 text or (for .jsonl) a line that is not a JSON object: a UsageError with the line."""
    if os.path.splitext(path)[1].lower() in (".parquet", ".arrow"):  # binary formats
        return
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if not any(line.strip() for line in lines):
        raise UsageError(f"data file {path!r} is empty")
    for number, line in enumerate(lines, start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"data file {path!r}, line {number}: not UTF-8 text ({error.reason} at byte "
                             f"{error.start} of the line); re-encode the file as UTF-8") from None
        if path.endswith(".jsonl") and text.strip():
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                raise UsageError(f"data file {path!r}, line {number}: not valid JSON ({error.msg}, column "
                                 f"{error.colno})") from None
            if not isinstance(row, dict):
                raise UsageError(f"data file {path!r}, line {number}: expected a JSON object per line, got "
                                 f"{type(row).__name__}")


def load_hub_dataset(name: str, config: str | None, split: str):
    """`datasets.load_dataset` of a Hub id; a path that does not exist, or a Hub that cannot provide the dataset
    (offline, unknown id), is one UsageError instead of the Hub lookup's traceback."""
    import datasets

    if looks_local(name):
        raise UsageError(f"dataset {name!r} does not exist (no such file or directory in {os.getcwd()}); give a "
                         ".jsonl, .json, .parquet or .csv file, a save_to_disk directory or a Hub dataset id")
    try:
        return datasets.load_dataset(name, config, split=split)
    except OSError as error:  # ConnectionError (offline), DatasetNotFoundError, FileNotFoundError
        raise UsageError(f"dataset {name!r} is not a local file or directory, and the Hub could not provide it: "
                         f"{first_line(error)}{offline_note()}") from None


def load_data(name: str, config: str | None = None, split: str = "train", split_flag: str = "--split",
              say: Callable[[str], None] | None = None):
    """The `split` of dataset `name` (a `datasets.Dataset`): a `save_to_disk` directory (a DatasetDict's split, or
    a Dataset), a data file (`DATA_FILE_FORMATS`, checked first), else a Hub id (`config` its configuration). A
    dataset that cannot be read, or has no rows, is one UsageError; `split_flag` is the setting that chooses the
    split, named in the messages; `say` is told which split was read when there was a choice."""
    import datasets

    if os.path.isdir(name):
        if os.path.exists(os.path.join(name, "dataset_dict.json")):
            splits = datasets.load_from_disk(name)
            if split not in splits:
                raise UsageError(f"dataset {name!r} has no split {split!r}; its splits are {list(splits)} (set "
                                 f"{split_flag})")
            if say is not None:
                say(f"split {split!r} of {name} (its splits: {', '.join(splits)}; choose with {split_flag})")
            dataset = splits[split]
        elif os.path.exists(os.path.join(name, "dataset_info.json")):
            dataset = datasets.load_from_disk(name)
        else:
            raise UsageError(unfinished_prepare(name) or (
                f"dataset {name!r} is a directory without a saved dataset (no dataset_info.json or dataset_dict.json "
                "as `save_to_disk` writes them); give a .jsonl, .json, .parquet, .csv or .arrow file, a save_to_disk "
                "directory or a Hub dataset id"))
    elif os.path.isfile(name):
        kind = DATA_FILE_FORMATS.get(os.path.splitext(name)[1].lower())
        if kind is None:
            raise UsageError(f"cannot read {name!r}; accepted files: {' '.join(DATA_FILE_EXTENSIONS)}, or a "
                             "save_to_disk directory")
        check_data_file(name)
        try:
            dataset = datasets.load_dataset(kind, data_files=name, split="train")
        except ValueError as error:  # e.g. lines of `{}` or a `[]` file: datasets' message names no file
            raise UsageError(f"data file {name!r} holds no rows with columns ({first_line(error)}); each row needs the "
                             "dataset's columns (in a .jsonl file: one JSON object with them per line)") from None
    else:
        dataset = load_hub_dataset(name, config, split)
        if say is not None:
            say(f"split {split!r} of the Hub dataset {name} (choose with {split_flag})")
    if len(dataset) == 0:
        raise UsageError(f"dataset {name!r} has no rows")
    return dataset


def unfinished_prepare(directory: str) -> str | None:
    """What to do about a `ppm-trl prepare` output directory that holds its progress files but no dataset (it
    failed, was interrupted or ran out of budget); None for any other directory. `datasets` would read the progress
    files as the data and fail with a CastError."""
    if not os.path.exists(os.path.join(directory, PROGRESS_FILE)):
        return None
    failures = os.path.join(directory, FAILURES_FILE)
    retry = 0
    if os.path.exists(failures):
        with open(failures, encoding="utf-8") as handle:
            retry = sum(bool(json.loads(line).get("retry", True)) for line in handle if line.strip())
    fix = (f"{retry} row(s) failed at the judge (listed in {failures}): rerun the same `ppm-trl prepare ... --out "
           f"{directory}` to retry only them, or add --drop-invalid to write the dataset without them"
           if retry else f"rerun the same `ppm-trl prepare ... --out {directory}` to finish it (prepared rows are kept)")
    return f"{directory!r} holds an unfinished `ppm-trl prepare` (progress files, no dataset written yet): {fix}"


def check_model_source(name: str, flag: str) -> None:
    """A model that is not a saved model directory and cannot come from the Hub (offline, unknown id): one
    UsageError naming the flag, before any dataset or model is loaded."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        if not any(os.path.exists(os.path.join(path, f)) for f in ("config.json", "adapter_config.json")):
            checkpoints = sorted(f for f in os.listdir(path) if f.startswith("checkpoint-"))
            raise UsageError(f"{flag} {name!r} is a directory without a saved model (no config.json)"
                             + (f"; its checkpoints: {', '.join(checkpoints)}" if checkpoints else ""))
        return
    if looks_local(name) or os.path.exists(path):
        raise UsageError(f"{flag} {name!r} does not exist (no such directory in {os.getcwd()}); give a saved model "
                         "directory or a Hub id such as Qwen/Qwen3-1.7B")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {name!r} is not a local directory (none in {os.getcwd()}), and the Hub could not "
                         f"provide it: {first_line(error)}{offline_note()}") from None


def load_train_dataset(script_args, split_flag: str = "dataset_train_split"):
    """The data of a run (`TrainScriptArguments`): a synthetic env's problems, or `load_data` of `dataset_name`."""
    if script_args.env_name and script_args.dataset_name:
        raise UsageError("give either `env_name` or `dataset_name`, not both")
    if script_args.env_name and getattr(script_args, "multiturn", False):
        from .envs.multiturn import make_multiturn_dataset

        return make_multiturn_dataset(script_args.env_name, script_args.env_n, script_args.env_size,
                                      seed=script_args.env_seed)
    if script_args.env_name:
        from .envs import make_dataset

        return make_dataset(script_args.env_name, script_args.env_n, script_args.env_size, seed=script_args.env_seed)
    if not script_args.dataset_name:
        raise UsageError("no data; set `env_name: <name>` (synthetic) or `dataset_name: <id or path>`")
    return load_data(script_args.dataset_name, script_args.dataset_config, script_args.dataset_train_split, split_flag)


def prepare_dataset(script_args, training_args, dataset, reward_names: list[str], source: str):
    """Map the user's columns (`problem_column`, ...) and check every column the run will read, before any model."""
    from .columns import check_required_columns, map_columns, required_run_columns

    flags = (script_args.problem_column, script_args.answer_column, script_args.reference_column)
    report: list[str] = []
    try:
        if not script_args.env_name or any(flags):  # a synthetic env's columns already are the trainers'
            # A row that cannot be used (no gold answer, an empty cell, a chat without a reply) is left out and
            # listed, as `ppm-trl prepare` does, not a stop at the first one.
            dataset, report = map_columns(dataset, *flags, source=source, invalid_rows="drop")
        check_required_columns(dataset, required_run_columns(script_args.method, reward_names, training_args), source)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if os.environ.get("RANK", "0") == "0":  # every process maps the same rows; one reports them
        for line in report:
            print(f"ppm-trl: {line}", file=sys.stderr)
    return dataset
