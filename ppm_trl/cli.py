"""`ppm-trl train | eval | prepare | estimate`.

`train` parses YAML + flags the TRL way (`TrlParser`): every field of the method's config (`PPMConfig`,
`PAPOConfig`, `ARGConfig` or TRL's `GRPOConfig`), of TRL's `ModelConfig` (LoRA: `--use_peft --lora_r ...`) and of
`TrainScriptArguments` below is a YAML key and a `--flag`; flags override the YAML; unknown keys are errors.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field

from .methods import METHODS, REWARDS, get_method, get_reward  # the registries (no TRL import)
from .plots import save_training_curves
from .quiet import quiet_third_party
from .report import method_metrics_mean, nothing_learned, training_summary  # noqa: F401  (shared with the trainers)


@dataclass
class TrainScriptArguments:
    """What to train on and with which rewards (the method's config holds the training knobs)."""

    method: str = field(default="grpo", metadata={"help": f"One of {', '.join(METHODS)}."})
    env_name: str | None = field(default=None, metadata={"help": "Synthetic env (multi_countdown, matrix, chain, ...)."})
    env_n: int = field(default=2, metadata={"help": "Horizon n of the synthetic env."})
    env_size: int = field(default=256, metadata={"help": "Number of training problems generated."})
    env_seed: int = field(default=0, metadata={"help": "Seed of the env generator."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "A Hub dataset id, a local dataset dir (save_to_disk) or data file."}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    dataset_train_split: str = field(default="train", metadata={"help": "Training split."})
    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={"help": f"Reward functions among {', '.join(REWARDS)}; default: env_outcome for an env, "
                  "accuracy otherwise (arg: accuracy + format)."},
    )
    multiturn: bool = field(
        default=False,
        metadata={"help": "Multi-turn form of the env (multi_countdown, matrix): one sub-problem per turn through "
                  "TRL's environment/tool loop; sets segmentation=turns, num_segments=n, the per-turn budget."},
    )
    tokens_per_turn: int = field(default=256, metadata={"help": "Multi-turn: generation budget of one turn."})
    tool_tokens_per_turn: int = field(default=128, metadata={"help": "Multi-turn: bound on one tool reply."})
    tiny_hidden_size: int = field(default=64, metadata={"help": "Width of `model_name_or_path: tiny`."})
    tiny_num_layers: int = field(default=2, metadata={"help": "Depth of `model_name_or_path: tiny`."})
    problem_column: str | None = field(
        default=None, metadata={"help": "Column holding the problem text; it becomes the chat `prompt` "
                                "(default: the dataset's own `prompt` column)."})
    answer_column: str | None = field(
        default=None, metadata={"help": "Column holding the gold answer (default: `answer`): a bare answer, a GSM8K "
                                "solution ending in `#### 72`, or a solution whose last `\\boxed{}` is the answer."})
    reference_column: str | None = field(
        default=None, metadata={"help": "Column holding the worked reference solution, for ARG and PAPO's judge "
                                "(default: `reference`); a GSM8K `#### 72` last line is read as `\\boxed{72}`."})
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Longest prompt in tokens (default: the model's context minus "
                                "max_completion_length). Longer prompts are an error unless long_prompts=drop."})
    long_prompts: str = field(
        default="drop", metadata={"help": "What to do with prompts longer than max_prompt_length: `drop` (train "
                                  "without them, counted and named on stderr) or `error` (refuse, naming the rows)."})
    license: str | None = field(
        default=None, metadata={"help": "Licence written into the model card (an SPDX id or Hub licence name, e.g. "
                                "apache-2.0). Default: the licence the base model's own card declares, else "
                                "`unknown`. (The ppm-trl methods' cards; plain grpo keeps TRL's card.)"})


def _config_class(method: str):
    try:
        return get_method(method).config_class()
    except ValueError as error:
        raise UsageError(str(error)) from None


# Exit status of a run that a judge budget (`judge_max_cost_usd`, `judge_max_total_tokens`; prepare's
# `--max-cost-usd`, `--max-total-tokens`) stopped: its work so far is saved, but it did not finish.
JUDGE_BUDGET_EXIT_CODE = 3


class UsageError(ValueError):
    """A user error (bad flag, config, data file or column): one line on stderr, exit code 2, no traceback."""


def read_yaml_config(path: str) -> dict:
    """The YAML config as a dict; a missing file, non-UTF-8 bytes or a syntax error is a UsageError with the line."""
    import yaml

    if not os.path.isfile(path):
        raise UsageError(f"config file {path!r} does not exist")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise UsageError(f"config file {path!r}, line {line}: not UTF-8 text ({error.reason} at byte {error.start} "
                         "of the file)") from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
        if context and start is not None:  # e.g. "while parsing a flow sequence", started at an earlier line
            problem += f" ({context} started at line {start.line + 1})"
        raise UsageError(f"config file {path!r}{where}: invalid YAML: {problem}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise UsageError(f"config file {path!r}: expected `key: value` lines, got a {type(config).__name__}")
    return config


def _config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _method_from_argv(argv: list[str]) -> str:
    """`method` decides the config class, so read it before the full parse (flag first, then the YAML)."""
    for i, arg in enumerate(argv):
        if arg == "--method" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--method="):
            return arg.split("=", 1)[1]
    path = _config_path(argv)
    return read_yaml_config(path).get("method", "grpo") if path else "grpo"


def check_config_values(config: dict, classes, path: str) -> None:
    """A list or mapping given to a scalar field (`num_segments: [1, 2]`) is a UsageError naming file and key."""
    import types
    import typing

    scalar = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for key, value in config.items():
            hint = hints.get(key)
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            kinds = [t for t in (typing.get_args(hint) if union else (hint,)) if t is not type(None)]
            if kinds and all(t in scalar for t in kinds) and isinstance(value, (list, dict)):
                raise UsageError(f"config file {path!r}: `{key}` must be {scalar[kinds[0]]}, got {value!r}")


# Flags each subcommand spells differently: the right spelling is named instead of a guess.
TRAIN_RENAMED = {"--split": "--dataset_train_split", "--model": "--model_name_or_path", "--dataset": "--dataset_name",
                 "--env": "--env_name"}
EVAL_RENAMED = {"--dataset_train_split": "--split", "--dataset-train-split": "--split", "--dataset": "--dataset_name",
                "--model_name_or_path": "--model", "--model-name-or-path": "--model"}


def check_flags(argv: list[str], parser, command: str, renamed: dict[str, str] | None = None) -> None:
    """A flag the parser does not know is a UsageError naming it and the closest known flags (did-you-mean).

    Run before the configs are built, so `--modle x` says so instead of `--model is required`, and a typo is
    reported before any config validation. A unique prefix of a known flag passes (argparse accepts it).
    """
    known = parser._option_string_actions  # option string -> action
    for arg in argv:
        if not arg.startswith("--") or arg == "--":
            continue
        flag = arg.split("=", 1)[0]
        if flag in known or flag == "--config":
            continue
        if renamed and flag in renamed:
            raise UsageError(f"unknown flag {flag}: `ppm-trl {command}` spells it {renamed[flag]}")
        matches = {known[o].dest: o for o in known if o.startswith(flag)} if parser.allow_abbrev else {}
        if len(matches) == 1:
            continue
        if len(matches) > 1:
            names = sorted({known[o].option_strings[0] for o in matches.values()})
            raise UsageError(f"ambiguous flag {flag}: it could be {', '.join(names)}")
        names = list(dict.fromkeys(known[o].option_strings[0] for o in _closest(flag, list(known))))
        hint = f"; did you mean {' or '.join(names)}?" if names else f"; `ppm-trl {command} --help` lists the flags"
        raise UsageError(f"unknown flag {flag}{hint}")


def _closest(word: str, candidates: list[str], cutoff: float = 0.6, margin: float = 0.1) -> list[str]:
    """The candidates most like `word` (difflib's ratio >= cutoff, within `margin` of the best), best first, <= 3."""
    import difflib

    scored = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in candidates), reverse=True)
    best = scored[0][0] if scored else 0.0
    return [c for score, c in scored if score >= cutoff and score >= best - margin][:3]


def check_config_keys(config: dict, parser, path: str) -> None:
    """A YAML key that is no field is a UsageError naming the file, the key and the closest fields."""
    fields = {action.dest for action in parser._actions} - {"help"}
    for key in config:
        if key == "env" or key in fields:  # `env:` sets environment variables (TrlParser)
            continue
        close = _closest(str(key), sorted(fields))
        hint = f"; did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
        raise UsageError(f"config file {path!r}: unknown key `{key}`{hint}")


def _flag_value(argv: list[str], flag: str, default):
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return default


def _user_setting(argv: list[str], config: dict, key: str):
    """The value the user gave `key` (a flag, either spelling, wins over the YAML), or None."""
    for flag in (f"--{key}", f"--{key.replace('_', '-')}"):
        value = _flag_value(argv, flag, None)
        if value is not None:
            return value
    return config.get(key)


def fit_generation_batch(given: dict, defaults: dict, num_processes: int = 1) -> tuple[dict, str | None]:
    """`ppm_trl.configs.fit_generation_batch` — the configs' own rule for whole groups in TRL's generation batch —
    with the fix spelled as flags and a settings conflict as a UsageError. `train` applies it before the parse for
    every method (TRL's GRPOConfig has no such rule) and prints the line it returns."""
    from .configs import fit_generation_batch as fit

    try:
        return fit(given, defaults, num_processes, flags=True)
    except ValueError as error:
        raise UsageError(str(error)) from None


def parse_train_args(argv: list[str]):
    import dataclasses

    from trl import ModelConfig, TrlParser

    config_class = _config_class(_method_from_argv(argv))
    classes = (TrainScriptArguments, config_class, ModelConfig)
    parser = TrlParser(classes, prog="ppm-trl train")
    check_flags(argv, parser, "train", TRAIN_RENAMED)
    path = _config_path(argv)
    config = read_yaml_config(path) if path else {}
    check_config_keys(config, parser, path)
    check_config_values(config, classes, path)
    generations = _user_setting(argv, config, "num_generations")
    if generations is not None and str(generations).lstrip("-").isdigit() and int(generations) < 1:
        # TRL's own __post_init__ would die on it with a ZeroDivisionError
        raise UsageError(f"num_generations must be >= 1 (samples per prompt; GRPO needs >= 2), got {generations}")
    use_cpu = str(_flag_value(argv, "--use_cpu", config.get("use_cpu", False))).lower() in ("true", "1", "yes")
    parser.set_defaults(bf16=auto_bf16() and not use_cpu)  # the YAML and flags override it
    from .configs import BATCH_KEYS

    given = {key: _user_setting(argv, config, key) for key in BATCH_KEYS}
    if all(v is None or str(v).isdigit() for v in given.values()):  # else the parser names the bad value
        defaults = {f.name: f.default for f in dataclasses.fields(config_class) if f.name in BATCH_KEYS}
        derived, note = fit_generation_batch(given, defaults, int(os.environ.get("WORLD_SIZE", "1")))
        parser.set_defaults(**derived)
        if note and os.environ.get("RANK", "0") == "0":
            print(f"ppm-trl train: {note}", file=sys.stderr)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except (ValueError, TypeError) as error:  # unknown YAML keys, and TRL's / our configs' value checks
        raise UsageError(str(error)) from None
    if script_args.long_prompts not in ("error", "drop"):
        raise UsageError(f"long_prompts must be `error` or `drop`, got {script_args.long_prompts!r}")
    return script_args, training_args, model_args


def auto_bf16() -> bool:
    """bf16 when a CUDA device supports it, else fp32 (TRL's default, bf16=True, fails on CPU)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def load_train_dataset(script_args):
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
    import datasets

    name = script_args.dataset_name
    if os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_dict.json")):
        splits = datasets.load_from_disk(name)
        if script_args.dataset_train_split not in splits:
            raise UsageError(f"dataset {name!r} has no split {script_args.dataset_train_split!r}; its splits are "
                             f"{list(splits)} (set dataset_train_split)")
        dataset = splits[script_args.dataset_train_split]
    elif os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_info.json")):
        dataset = datasets.load_from_disk(name)
    elif os.path.isdir(name) and unfinished_prepare(name):
        raise UsageError(unfinished_prepare(name))
    elif os.path.isfile(name):
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(os.path.splitext(name)[1])
        if kind is None:
            raise UsageError(f"cannot read {name!r}; accepted files: .jsonl .json .parquet .csv")
        check_data_file(name)
        try:
            dataset = datasets.load_dataset(kind, data_files=name, split="train")
        except ValueError as error:  # e.g. lines of `{}` or a `[]` file: datasets' message names no file
            raise UsageError(f"data file {name!r} holds no rows with columns ({_first_line(error)}); each row needs the "
                             "dataset's columns (in a .jsonl file: one JSON object with them per line)") from None
    else:
        dataset = load_hub_dataset(name, script_args.dataset_config, script_args.dataset_train_split)
    if len(dataset) == 0:
        raise UsageError(f"dataset {name!r} has no rows")
    return dataset


def unfinished_prepare(directory: str) -> str | None:
    """What to do about a `ppm-trl prepare` output directory that holds its progress files but no dataset (it
    failed, was interrupted or ran out of budget); None for any other directory. `datasets` would read the progress
    files as the data and fail with a CastError."""
    from .prepare import FAILURES_FILE, PROGRESS_FILE

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


DATA_FILE_EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv", ".arrow")


def looks_local(name: str) -> bool:
    """A path rather than a Hub id (`org/name`): ./x, /x, ~/x, a/b/c, or a data file name such as x.jsonl."""
    return (name.startswith((".", "/", "~")) or name.count("/") >= 2
            or os.path.splitext(name)[1].lower() in DATA_FILE_EXTENSIONS)


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
                         f"{_first_line(error)}{_offline_note()}") from None


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
    if name.startswith((".", "/", "~")) or name.count("/") >= 2 or os.path.exists(path):
        raise UsageError(f"{flag} {name!r} does not exist (no such directory in {os.getcwd()}); give a saved model "
                         "directory or a Hub id such as Qwen/Qwen3-1.7B")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {name!r} is not a local directory (none in {os.getcwd()}), and the Hub could not "
                         f"provide it: {_first_line(error)}{_offline_note()}") from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _offline_note() -> str:
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


def prepare_dataset(script_args, training_args, dataset, reward_names: list[str], source: str):
    """Map the user's columns (`problem_column`, ...) and check every column the run will read, before any model."""
    from .columns import check_required_columns, map_columns, required_columns

    flags = (script_args.problem_column, script_args.answer_column, script_args.reference_column)
    report: list[str] = []
    try:
        if not script_args.env_name or any(flags):  # a synthetic env's columns already are the trainers'
            # A row that cannot be used (no gold answer, an empty cell, a chat without a reply) is left out and
            # listed, as `ppm-trl prepare` does, not a stop at the first one.
            dataset, report = map_columns(dataset, *flags, source=source, invalid_rows="drop")
        check_required_columns(dataset, required_columns(script_args.method, reward_names, training_args), source)
    except ValueError as error:
        raise UsageError(str(error)) from None
    for line in report:
        print(f"ppm-trl: {line}", file=sys.stderr)
    return dataset


def check_prompt_lengths(dataset, tokenizer, model_path: str, script_args, training_args):
    """Refuse (or with long_prompts=drop, drop and count) prompts that do not fit; returns the dataset."""
    from transformers import AutoConfig

    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    limits = []
    if script_args.max_prompt_length is not None:
        limits.append((script_args.max_prompt_length, f"max_prompt_length={script_args.max_prompt_length}"))
    if positions is not None:
        room = positions - training_args.max_completion_length
        limits.append((room, f"the model's {positions} positions minus max_completion_length="
                             f"{training_args.max_completion_length}"))
    if not limits:
        return dataset
    limit, why = min(limits)
    if limit < 1:
        raise UsageError(f"no room for a prompt: {why} leaves {limit} tokens; lower max_completion_length")
    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in dataset["prompt"]]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    too_long = [i for i, n in enumerate(lengths) if n > limit]
    if not too_long:
        return dataset
    message = (f"{len(too_long)} of {len(lengths)} prompts are longer than {limit} tokens ({why}); first: row "
               f"{too_long[0]} with {lengths[too_long[0]]} tokens")
    if script_args.long_prompts == "drop":
        if len(too_long) == len(lengths):
            raise UsageError(f"every prompt is too long: {message}; raise --max_prompt_length or lower "
                             "--max_completion_length")
        print(f"ppm-trl train: leaving out the prompts that do not fit: {message} (--long_prompts error refuses "
              "them instead)", file=sys.stderr)
        return dataset.select(sorted(set(range(len(lengths))) - set(too_long)))
    raise UsageError(f"{message}. They would train on clipped completions only; shorten them, raise "
                     "--max_prompt_length / lower --max_completion_length, or pass --long_prompts drop")


def resolve_model(script_args, model_args, training_args) -> str:
    """`tiny` builds the offline tiny model into the output dir; a local path must exist and becomes absolute."""
    from .trainers.common import resolve_model_path

    name = model_args.model_name_or_path
    if name in (None, "", "tiny"):
        return resolve_model_path("tiny", training_args, hidden_size=script_args.tiny_hidden_size,
                                  num_hidden_layers=script_args.tiny_num_layers, tool_calling=script_args.multiturn)
    looks_local = name.startswith((".", "/", "~")) or name.count("/") >= 2  # a Hub id is `org/name`
    if looks_local and not os.path.exists(os.path.expanduser(name)):
        raise UsageError(f"model path {name!r} does not exist (give a local directory with config.json, "
                         "a Hub id such as Qwen/Qwen3-1.7B, or `tiny`)")
    check_model_source(name, "--model_name_or_path")
    return resolve_model_path(os.path.expanduser(name), training_args)


def reward_names(script_args) -> list[str]:
    names = list(script_args.reward_funcs)
    if not names:
        names = ["env_outcome"] if script_args.env_name else ["accuracy"]
        names += get_method(script_args.method).extra_rewards
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise UsageError(f"unknown reward function(s) {unknown}; accepted: {', '.join(REWARDS)}")
    return names


def build_reward_funcs(script_args, training_args):
    names = reward_names(script_args)  # ARG weighs `format` by its format_reward_weight itself
    return [get_reward(n).load() for n in names]


def build_trainer(script_args, training_args, model_args):
    from transformers import AutoTokenizer
    from trl import get_peft_config

    source = script_args.dataset_name or f"env {script_args.env_name!r}"
    train_dataset = prepare_dataset(script_args, training_args, load_train_dataset(script_args),
                                    reward_names(script_args), source)
    model = resolve_model(script_args, model_args, training_args)
    if not script_args.multiturn:  # tool-calling prompts are templated with their tools by TRL
        tokenizer = AutoTokenizer.from_pretrained(model)
        train_dataset = check_prompt_lengths(train_dataset, tokenizer, model, script_args, training_args)
    if model_args.dtype not in (None, "auto") or model_args.attn_implementation:
        training_args.model_init_kwargs = {
            **(training_args.model_init_kwargs or {}),
            **({"dtype": model_args.dtype} if model_args.dtype not in (None, "auto") else {}),
            **({"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}),
        }
    extra = {}
    if script_args.multiturn:
        from .envs.multiturn import MULTITURN_ENVIRONMENTS, multiturn_config_kwargs

        if script_args.env_name not in MULTITURN_ENVIRONMENTS:
            raise UsageError(f"`multiturn` needs env_name in {sorted(MULTITURN_ENVIRONMENTS)}, "
                             f"got {script_args.env_name!r}")
        settings = multiturn_config_kwargs(script_args.env_n, script_args.tokens_per_turn,
                                           script_args.tool_tokens_per_turn, use_vllm=training_args.use_vllm)
        for key, value in settings.items():
            if hasattr(training_args, key):
                setattr(training_args, key, value)
        extra["environment_factory"] = MULTITURN_ENVIRONMENTS[script_args.env_name]
    trainer_class = get_method(script_args.method).trainer_class()
    trainer = trainer_class(
        model=model,
        reward_funcs=build_reward_funcs(script_args, training_args),
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
        callbacks=[log_last_step_callback()],
        **extra,
    )
    from .trainers.base import MethodTrainer, RunReport

    trainer.remove_callback(RunReport)  # `report_done` says the same under the command's name, with the eval to run
    if isinstance(trainer, MethodTrainer):  # what its model card records (an env describes itself)
        trainer.model_card_dataset = script_args.dataset_name
        trainer.model_card_license = script_args.license
    return trainer


def run_training(script_args, training_args, model_args):
    """Build the trainer, train (resuming when asked), save, push to the Hub when asked; returns (trainer, result).
    `resume_from_checkpoint: last` (or `true`) resumes from the newest complete checkpoint of output_dir; which one
    is said on stderr, and a missing or incomplete checkpoint is an error before any model is loaded."""
    from .trainers.base import resolve_resume_checkpoint

    checkpoint, message = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if message and os.environ.get("RANK", "0") == "0":
        print(f"ppm-trl train: {message}", file=sys.stderr, flush=True)
    trainer = build_trainer(script_args, training_args, model_args)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name or script_args.env_name)
    return trainer, result


def run_example(method: str, argv: list[str] | None = None) -> dict:
    """`examples/train_<method>.py`: parse YAML + flags for one method, train, save, print `train_<method>: done`."""
    quiet_third_party()
    argv = list(sys.argv[1:] if argv is None else argv)
    path = _config_path(argv)
    for said in (read_yaml_config(path).get("method") if path else None, _flag_value(argv, "--method", None)):
        if said not in (None, "grpo", method):  # "grpo" is the field's default: not a choice the user made
            raise SystemExit(f"train_{method}.py trains `{method}`, but the config says method: {said}")
    # The same parse, checks and bf16 default as `ppm-trl train`.
    script_args, training_args, model_args = parse_train_args([*argv, "--method", method])
    trainer, result = run_training(script_args, training_args, model_args)
    summary = training_summary(trainer, result, method)
    if trainer.accelerator.is_main_process:
        report_done(f"train_{method}", summary, trainer, script_args)
    if stopped_early(trainer):
        raise SystemExit(JUDGE_BUDGET_EXIT_CODE)
    return summary


def train(argv: list[str]) -> None:
    quiet_third_party()
    script_args, training_args, model_args = parse_train_args(argv)
    trainer, result = run_training(script_args, training_args, model_args)
    if trainer.accelerator.is_main_process:
        report_done("ppm-trl train", training_summary(trainer, result, script_args.method), trainer, script_args)
    if stopped_early(trainer):  # the model is saved, but the run did not finish: not status 0
        raise SystemExit(JUDGE_BUDGET_EXIT_CODE)


def stopped_early(trainer) -> list[str]:
    """Why a callback (the judge budget) ended training before max_steps; empty when none did."""
    return [callback.stopped for callback in getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
            if getattr(callback, "stopped", None)]


def report_done(prefix: str, summary: dict, trainer, script_args) -> None:
    """`<prefix>: done {json}` on stdout (naming `training_curves.png` when drawn); on stderr a warning when nothing
    was learned, and the `eval` to run next."""
    curves, no_curves = save_training_curves(trainer.state.log_history, summary["output_dir"],
                                             f"{summary.get('method', prefix)}: {os.path.basename(summary['output_dir'])}")
    if curves:
        summary["training_curves"] = curves
    print(f"{prefix}: done " + json.dumps(summary), flush=True)
    if no_curves:
        print(f"{prefix}: {no_curves}", file=sys.stderr)
    for reason in stopped_early(trainer):
        print(f"{prefix}: stopped early (exit status {JUDGE_BUDGET_EXIT_CODE}): {in_flag_spelling(reason)}",
              file=sys.stderr)
    problem = nothing_learned(trainer.state.log_history, trainer.args)
    if problem:
        print(f"{prefix}: warning: nothing was learned: {in_flag_spelling(problem)}", file=sys.stderr)
    print(f"{prefix}: evaluate with: {eval_command(summary['output_dir'], script_args)}", file=sys.stderr, flush=True)


def eval_command(output_dir: str, script_args) -> str:
    """The `ppm-trl eval` line for a trained model: the env on held-out seeds, or the user's held-out data."""
    import shlex

    if script_args.env_name:
        data = f"--env {script_args.env_name} --env_n {script_args.env_n}"
    else:
        data = "--dataset_name HELD_OUT_DATA" + "".join(
            f" --{flag} {shlex.quote(value)}" for flag, value in (("problem_column", script_args.problem_column),
                                                                  ("answer_column", script_args.answer_column)) if value)
    return f"ppm-trl eval --model {shlex.quote(output_dir)} {data} --num_samples 8 --k 1 8"


def log_last_step_callback():
    """A callback that logs the last step when it is not a logging step: TRL's metrics since the last log would be
    dropped, and the `done` summary of a run shorter than `logging_steps` would have none."""
    from transformers import TrainerCallback

    class LogLastStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if (state.global_step >= state.max_steps and args.logging_strategy == "steps"
                    and state.global_step % state.logging_steps):
                control.should_log = True
            return control

    return LogLastStep()


DEFAULT_EVAL_MAX_NEW_TOKENS = 512  # `eval`'s generation budget when neither the flag nor the model card says


@dataclass
class EvalArguments:
    """`ppm-trl eval`: a YAML key or a `--flag` each, like `train` (`--config eval.yaml` works too)."""

    model: str = field(default=None, metadata={"help": "Checkpoint directory (or Hub id) to evaluate. Required."})
    env_name: str | None = field(
        default=None, metadata={"aliases": ["--env"], "help": "Synthetic env to evaluate on (held-out seed); the "
                                "YAML key is `env_name` (TRL's parser keeps `env` for environment variables)."})
    env_n: int = field(default=2, metadata={"help": "Horizon n of the synthetic env."})
    env_size: int = field(default=64, metadata={"help": "Number of synthetic problems."})
    env_seed: int = field(default=10_000, metadata={"help": "Seed of the env generator (training's default is 0)."})
    dataset_name: str | None = field(
        default=None, metadata={"help": "Or a dataset (Hub id, save_to_disk dir, .jsonl/.json/.parquet/.csv file)."})
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    split: str = field(default="test", metadata={"help": "Split of a Hub / save_to_disk dataset."})
    problem_column: str | None = field(default=None, metadata={"help": "As in `train`: the problem text column."})
    answer_column: str | None = field(default=None, metadata={"help": "As in `train`: the gold answer column."})
    num_samples: int = field(default=8, metadata={"help": "n, samples per problem."})
    k: list[int] = field(default_factory=lambda: [1, 8], metadata={"help": "The k of pass@k (each <= num_samples)."})
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Generation budget per sample. Default: the max_completion_length the model "
                                "was trained with, as its model card records it (ppm-trl's cards), else 512."})
    max_problems: int | None = field(
        default=None, metadata={"help": "Evaluate only the first N problems (of the dataset, or of the env's "
                                "env_size); a quick check before a full evaluation."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0 = greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    batch_size: int = field(default=64, metadata={"help": "HF generation batch (sequences)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    backend: str = field(default="auto", metadata={"help": "auto (vLLM on a GPU when installed) | hf | vllm."})
    output: str | None = field(
        default=None, metadata={"help": "Write metrics and per-problem completions and correctness as JSON here."})

    def __post_init__(self):
        if not self.model:
            raise UsageError("--model is required (a checkpoint directory or Hub id)")
        if not self.env_name and not self.dataset_name:
            raise UsageError("give --env NAME (synthetic) or --dataset_name ID_OR_FILE")
        if self.num_samples < 1:
            raise UsageError(f"--num_samples must be >= 1, got {self.num_samples}")
        for flag in ("max_problems", "max_new_tokens"):
            if getattr(self, flag) is not None and getattr(self, flag) < 1:
                raise UsageError(f"--{flag} must be >= 1, got {getattr(self, flag)}")
        bad = [k for k in self.k if not 1 <= k <= self.num_samples]
        if bad:
            raise UsageError(f"--k {' '.join(map(str, bad))}: pass@k needs 1 <= k <= num_samples "
                             f"({self.num_samples}); raise --num_samples or drop those k")
        if self.backend not in ("auto", "hf", "vllm"):
            raise UsageError(f"--backend must be auto, hf or vllm, got {self.backend!r}")


def parse_eval_args(argv: list[str]) -> EvalArguments:
    from trl import TrlParser

    parser = TrlParser((EvalArguments,), prog="ppm-trl eval")
    check_flags(argv, parser, "eval", EVAL_RENAMED)
    path = _config_path(argv)
    if path:
        config = read_yaml_config(path)
        check_config_keys(config, parser, path)
        check_config_values(config, (EvalArguments,), path)
    try:
        (args,) = parser.parse_args_and_config(argv)
    except UsageError:
        raise
    except (ValueError, TypeError) as error:
        raise UsageError(str(error)) from None
    return args


def evaluate(argv: list[str]) -> dict:
    """Sample `num_samples` completions per problem, verify them, print (and optionally write) pass@k and avg@n."""
    args = parse_eval_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import evaluation, rewards

    script = TrainScriptArguments(env_name=args.env_name, env_n=args.env_n, env_size=args.env_size, env_seed=args.env_seed,
                                  dataset_name=args.dataset_name, dataset_config=args.dataset_config,
                                  dataset_train_split=args.split, problem_column=args.problem_column,
                                  answer_column=args.answer_column)
    source = args.dataset_name or f"env {args.env_name!r}"
    reward = "env_outcome" if args.env_name else "accuracy"
    check_model_source(args.model, "--model")
    dataset = prepare_dataset(script, None, load_train_dataset(script), [reward], source)
    if args.max_problems is not None and args.max_problems < len(dataset):
        dataset = dataset.select(range(args.max_problems))
    max_new_tokens, budget_from = args.max_new_tokens, "--max_new_tokens"
    if max_new_tokens is None:
        trained = evaluation.trained_completion_length(args.model)
        max_new_tokens, budget_from = ((trained, "the max_completion_length its model card records") if trained
                                       else (DEFAULT_EVAL_MAX_NEW_TOKENS, "the default; set --max_new_tokens"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    backend = args.backend
    if backend == "auto":
        import importlib.util

        import torch

        backend = "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"
    print(f"ppm-trl eval: {len(dataset)} problems from {source}, {args.num_samples} samples each of at most "
          f"{max_new_tokens} new tokens ({budget_from}) ({backend})", file=sys.stderr)
    if backend == "vllm":
        samples = evaluation.sample_completions_vllm(args.model, tokenizer, dataset["prompt"], args.num_samples,
                                                     max_new_tokens, args.temperature, args.top_p, args.seed)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model)
        samples = evaluation.sample_completions(model, tokenizer, dataset["prompt"], args.num_samples,
                                                max_new_tokens, args.temperature, args.top_p, args.batch_size,
                                                args.seed, progress=True)
    verifier = rewards.env_outcome_reward if args.env_name else rewards.accuracy_reward
    columns = [c for c in dataset.column_names if c != "prompt"]
    correct = []
    for index, completions in enumerate(samples):
        row = dataset[index]
        kwargs = {c: [row[c]] * len(completions) for c in columns}
        correct.append([bool(r) for r in verifier(completions, **kwargs)])
    metrics = evaluation.summarize(correct, args.k)
    report = {"model": args.model, "dataset": source, "problems": len(dataset), "samples_per_problem": args.num_samples,
              "max_new_tokens": max_new_tokens, **metrics}
    print("ppm-trl eval: " + json.dumps(report))
    if args.output:
        problems = [{"index": i, "prompt": dataset[i]["prompt"], "answer": dataset[i].get("answer"),
                     "completions": completions, "correct": flags}
                    for i, (completions, flags) in enumerate(zip(samples, correct))]
        with open(args.output, "w") as f:
            json.dump({**report, "metrics": metrics, "per_problem": problems, "args": vars(args)}, f, indent=1)
    return report


USAGE = ("usage: ppm-trl {train,eval,prepare,estimate} ... [--debug]\n"
         f"  train    --config FILE.yaml [--key value ...]  (method: {'|'.join(METHODS)})\n"
         "  eval     --model DIR --env NAME | --dataset_name ID  (pass@k, avg@n)\n"
         "  prepare  --dataset ID --reference-column COL --judge-model M --out DIR  (answer, reference, points, graph)\n"
         "  estimate [prepare] <train's or prepare's flags> [--calibrate N] [--json F]  (judge requests, tokens, "
         "cost, time)\n"
         "  --debug  show the Python traceback of an error")


def main(argv: list[str] | None = None) -> None:
    """Dispatch; a user error prints one `ppm-trl <command>: error: ...` line and exits 2, a judge that cannot be
    used (auth, connection, too many unscorable answers) exits 1; `--debug` re-raises with the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    commands = ("train", "eval", "prepare", "estimate")
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(USAGE)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, rest = argv[0], argv[1:]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from .judge import JudgeConfigurationError, callback

    # A judge that cannot judge is a runtime failure (exit 1), not a usage error.
    runtime_errors = (JudgeConfigurationError, *([callback.JudgeUnscorableError]
                                                 if hasattr(callback, "JudgeUnscorableError") else []))
    try:
        if command == "train":
            train(rest)
        elif command == "eval":
            evaluate(rest)
        elif command == "estimate":
            from .estimate import main as estimate_main

            estimate_main(rest)
        else:
            from .prepare import main as prepare_main

            prepare_main(rest)
    except SystemExit as exit_:
        if debug or not isinstance(exit_.code, str):  # argparse's own usage errors are already printed
            raise
        _fail(command, exit_.code, 2)
    except KeyboardInterrupt:  # Ctrl-C before training started (`train` itself saves and exits 130)
        if debug:
            raise
        print(f"\nppm-trl {command}: interrupted (Ctrl-C) before any step was trained; nothing was saved",
              file=sys.stderr)
        raise SystemExit(130) from None
    except runtime_errors as error:
        if debug:
            raise
        _fail(command, in_flag_spelling(str(error), rest if command == "train" else None), 1)
    except ValueError as error:  # our checks (columns, configs, data files, trainers) raise ValueError / UsageError
        if debug:
            raise
        _fail(command, in_flag_spelling(str(error), rest if command == "train" else None), 2)


def train_fields(argv: list[str] | None = None) -> set[str]:
    """The names `ppm-trl train` takes as `--flags`: its script arguments, TRL's ModelConfig and the method's config
    (every method's when `argv` names none that can be read)."""
    import dataclasses

    classes = [TrainScriptArguments]
    try:
        from trl import ModelConfig

        classes.append(ModelConfig)
        methods = [_method_from_argv(argv)] if argv is not None else list(METHODS)
        classes += [get_method(name).config_class() for name in methods]
    except (ImportError, ValueError, UsageError):  # an unknown method or config file: the fields known so far
        pass
    return {f.name for cls in classes for f in dataclasses.fields(cls)}


# A setting a library message suggests in Python spelling: `name=True`, `name="judge"`, `name: drop` (YAML).
_PYTHON_SETTING = re.compile(r"""(?<![\w.-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?:=|: )(?:"([^"]*)"|'([^']*)'|"""
                             r"""(True|False|true|false|[\w.+-]+))(?=[\s`.,;:)]|$)""")
_SETTING_NAME = re.compile(r"(?<=\()([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?=\))")  # "(judge_max_cost_usd)"


def in_flag_spelling(message: str, argv: list[str] | None = None) -> str:
    """A library message as `ppm-trl train` is used: a config field it names as the flag that sets it
    (`arg_skip_invalid_references=True` → `--arg_skip_invalid_references true`, `progress_scorer="judge"` →
    `--progress_scorer judge`, `(judge_max_cost_usd)` → `(--judge_max_cost_usd)`); a YAML key the message is
    about (`num_segments`) stays. The library raises in Python
    spelling, for Python users; only the command line translates."""
    if not _PYTHON_SETTING.search(message) and not _SETTING_NAME.search(message):
        return message
    fields = train_fields(argv)

    def setting(match):
        name, value = match.group(1), next(v for v in match.group(2, 3, 4) if v is not None)
        # A suggestion, not a description such as "a batch of per_device_train_batch_size=8 × 1 process".
        suggested = (match.group(2, 3) != (None, None) or value in ("True", "False")
                     or message[: match.start()].endswith(("set ", "with ", "pass ", "or ", "`")))
        if name not in fields or not suggested:
            return match.group(0)
        return f"--{name} {value.lower() if value in ('True', 'False') else value}"

    message = _PYTHON_SETTING.sub(setting, message)
    return _SETTING_NAME.sub(lambda m: f"--{m.group(1)}" if m.group(1) in fields else m.group(0), message)


def _fail(command: str, message: str, code: int) -> None:
    prefix = f"ppm-trl {command}: "
    message = message[len(prefix):] if message.startswith(prefix) else message
    print(f"{prefix}error: {message}\n(rerun with --debug for the traceback)", file=sys.stderr)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
