"""What a command reads from the user and how it says what is wrong: the YAML config, the flags (with a
did-you-mean for a typo, before anything else is checked), and `UsageError` — one line on stderr, exit status 2.

Shared by every subcommand (`train.py`, `evaluate.py`, `prepare/`, `estimate/`); it imports none of them.
"""

from __future__ import annotations

import os
import re

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


def flag_value(argv: list[str], flag: str, default=None):
    """The value given to `flag` (`--flag value` or `--flag=value`; the first one), else `default`."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return default


def config_path(argv: list[str]) -> str | None:
    """The `--config FILE` of a command line, if any."""
    return flag_value(argv, "--config")


def user_setting(argv: list[str], config: dict, key: str):
    """The value the user gave `key` (a flag, either spelling, wins over the YAML), or None."""
    for flag in (f"--{key}", f"--{key.replace('_', '-')}"):
        value = flag_value(argv, flag)
        if value is not None:
            return value
    return config.get(key)


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
        names = list(dict.fromkeys(known[o].option_strings[0] for o in closest(flag, list(known))))
        hint = f"; did you mean {' or '.join(names)}?" if names else f"; `ppm-trl {command} --help` lists the flags"
        raise UsageError(f"unknown flag {flag}{hint}")


def closest(word: str, candidates: list[str], cutoff: float = 0.6, margin: float = 0.1) -> list[str]:
    """The candidates most like `word` (difflib's ratio >= cutoff, within `margin` of the best), best first, <= 3."""
    import difflib

    scored = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in candidates), reverse=True)
    best = scored[0][0] if scored else 0.0
    return [c for score, c in scored if score >= cutoff and score >= best - margin][:3]


# Environment variables a config file may not set (TrlParser applies a YAML `env:` block to os.environ): where
# requests go (HF_ENDPOINT, *_API_BASE, proxies, CA bundles), credentials, and what code runs (LD_*, PYTHON*). A
# shared config is data; these belong in the user's own shell.
_ENV_REFUSED = re.compile(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|ENDPOINT|PROXY|CERT|CERTS)($|_)"
                          r"|BASE_URL|API_BASE|_BASE$|CA_BUNDLE|^LD_|^DYLD_|^PYTHON", re.IGNORECASE)


def check_config_keys(config: dict, parser, path: str) -> None:
    """A YAML key that is no field is a UsageError naming the file, the key and the closest fields; an `env:` block
    that sets a variable of `_ENV_REFUSED` is one too."""
    fields = {action.dest for action in parser._actions} - {"help"}
    for key in config:
        if key == "env":  # `env:` sets environment variables (TrlParser)
            check_config_env(config[key], path)
            continue
        if key in fields:
            continue
        close = closest(str(key), sorted(fields))
        hint = f"; did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
        raise UsageError(f"config file {path!r}: unknown key `{key}`{hint}")


def check_config_env(env: object, path: str) -> None:
    if not isinstance(env, dict):
        raise UsageError(f"config file {path!r}: `env` must map variable names to values, got {type(env).__name__}")
    refused = sorted(str(name) for name in env if _ENV_REFUSED.search(str(name)))
    if refused:
        raise UsageError(f"config file {path!r}: `env` may not set {', '.join(refused)}: a config file does not choose "
                         "where requests go, which credentials they carry or what code runs; set them in your shell")


def dashed_flags(argv: list[str], parser, command: str, renamed: dict[str, str] | None = None) -> list[str]:
    """`argv` for a parser whose flags are dashed (`prepare`): `--problem_column` (train's spelling) is read as
    `--problem-column`; then `check_flags` (an unknown flag is a UsageError with the closest known ones)."""
    known = parser._option_string_actions
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        dashed = flag.replace("_", "-")
        if arg.startswith("--") and flag not in known and (dashed in known or dashed in (renamed or {})):
            arg = dashed + eq + value
        out.append(arg)
    check_flags(out, parser, command, renamed)
    return out


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
