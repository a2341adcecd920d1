"""Synthetic tasks with reference solutions and ground-truth reasoning points (paper §5.1, App. C).

`make_dataset(name, n, size, seed)` builds `size` problems of horizon `n` from one task family:

| name | points | graph |
|---|---|---|
| `multi_countdown` | n independent Countdown problems + the final answer (n + 1 points) | the goal obsoletes the rest |
| `matrix` | the matrix after each of n sequential operations | chain: point k obsoletes 1..k-1 |
| `chain` | the n derived quantities of a GSM-Infinite-style word problem | a quantity obsoletes its premises |

Every row has the dataset columns of `docs/design.md`, section "Data" (`prompt`, `answer`, `reference`,
`reasoning_points`, `reasoning_graph`), plus `env` (the task name, which `ppm_trl.rewards.env_*` dispatch on), `n`
(the horizon) and `task` (a JSON string with the task's private data — numbers, intermediate matrices, quantity
values — that its matcher reads). Generation is deterministic in `(name, n, size, seed)` and every row is checked
before it is returned: its reference passes `verify` and reaches every point through `match_points`.

Env modules are imported lazily; `multi_add` is registered when `ppm_trl/envs/multi_add.py` exists.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import random
from functools import cache
from typing import Any

from ppm_trl.envs.base import SyntheticEnv

# name -> (module, class); modules are imported on first use.
_REGISTRY: dict[str, tuple[str, str]] = {
    "multi_countdown": ("ppm_trl.envs.multi_countdown", "MultiCountdownEnv"),
    "matrix": ("ppm_trl.envs.matrix", "MatrixEnv"),
    "chain": ("ppm_trl.envs.chain", "ChainEnv"),
    "multi_add": ("ppm_trl.envs.multi_add", "MultiAddEnv"),
    "multi_add_any_order": ("ppm_trl.envs.multi_add_any_order", "MultiAddAnyOrderEnv"),
    "multi_add_boxed": ("ppm_trl.envs.multi_add_boxed", "MultiAddBoxedEnv"),
    "chain_add": ("ppm_trl.envs.chain_add", "ChainAddEnv"),
}


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


ENV_NAMES: tuple[str, ...] = tuple(name for name, (module, _) in _REGISTRY.items() if _module_exists(module))

COLUMNS = ("prompt", "answer", "reference", "reasoning_points", "reasoning_graph", "env", "n")


def get_env(name: str) -> SyntheticEnv:
    """The (stateless, shared) env instance registered under `name`."""
    if not isinstance(name, str) or name not in ENV_NAMES:
        raise ValueError(f"unknown env {name!r}; accepted names: {', '.join(ENV_NAMES)}")
    return _instance(name)


@cache
def _instance(name: str) -> SyntheticEnv:
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)()


def features():
    """The explicit Arrow schema (an all-empty `reasoning_graph` column would otherwise infer as null)."""
    from datasets import Features, List, Value

    rule = {"if_all": List(Value("int64")), "makes_obsolete": List(Value("int64"))}
    return Features({
        "prompt": List({"role": Value("string"), "content": Value("string")}),
        "answer": Value("string"),
        "reference": Value("string"),
        "reasoning_points": List(Value("string")),
        "reasoning_graph": List(rule),
        "env": Value("string"),
        "n": Value("int64"),
        "task": Value("string"),
    })


def _check_positive_int(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")


def make_dataset(name: str, n: int, size: int, seed: int = 0):
    """`size` problems of horizon `n` from env `name` as a `datasets.Dataset` (deterministic in the arguments)."""
    from datasets import Dataset

    env = get_env(name)
    _check_positive_int(n, "n (the task horizon)")
    _check_positive_int(size, "size (the number of rows)")
    rng = random.Random(seed)
    rows = []
    for index in range(size):
        row = env.generate_row(n, rng)
        row.setdefault("env", name)
        row.setdefault("n", n)
        check_row(env, row, index)
        rows.append(row)
    # Pin the shared columns' types (an all-empty `reasoning_graph` would infer as a list of nulls); an env's
    # extra columns keep their inferred types.
    schema = features()
    for column in [c for c in schema if c not in rows[0]]:
        del schema[column]
    extra = [column for column in rows[0] if column not in schema]
    if extra:
        schema.update(Dataset.from_list([{c: row.get(c) for c in extra} for row in rows]).features)
    return Dataset.from_list(rows, features=schema)


def check_row(env: SyntheticEnv, row: dict[str, Any], index: int = 0) -> None:
    """Raise if a generated row breaks the column contract or its reference fails its own matcher/verifier."""
    missing = [column for column in COLUMNS if column not in row]
    if missing:
        raise RuntimeError(f"{env.name} row {index} lacks columns {missing}")
    num_points = len(row["reasoning_points"])
    for rule in row["reasoning_graph"]:
        items = list(rule["if_all"]) + list(rule["makes_obsolete"])
        if not items or any(not 1 <= item <= num_points for item in items):
            raise RuntimeError(f"{env.name} row {index}: graph rule {rule} outside points 1..{num_points}")
    if not env.verify(row, row["reference"]):
        raise RuntimeError(f"{env.name} row {index}: the reference fails its own verifier:\n{row['reference']}")
    reached = env.match_points(row, row["reference"])
    if reached != set(range(1, num_points + 1)):
        raise RuntimeError(f"{env.name} row {index}: the reference reaches points {sorted(reached)} of {num_points}")


# ---- helpers shared by the env modules ------------------------------------------------------------------------


def build_row(env: str, n: int, user_text: str, answer: str, reference: str, points: list[str],
              graph: list[dict[str, list[int]]], task: dict[str, Any]) -> dict[str, Any]:
    """One dataset row in the column layout every env shares."""
    return {
        "prompt": [{"role": "user", "content": user_text}],
        "answer": answer,
        "reference": reference,
        "reasoning_points": points,
        "reasoning_graph": graph,
        "env": env,
        "n": n,
        "task": json.dumps(task, sort_keys=True),
    }


def load_task(row: dict[str, Any]) -> dict[str, Any]:
    """The row's `task` data (stored as a JSON string; a dict is accepted too)."""
    task = row.get("task") if isinstance(row, dict) else None
    if isinstance(task, str):
        task = json.loads(task)
    if not isinstance(task, dict):
        raise ValueError(f"row has no 'task' data (a JSON object string written by make_dataset), got {task!r}")
    return task


def first_statements(text: str, parse_line) -> dict[Any, Any]:
    """{label: value} from the FIRST well-formed complete line per label; later restatements are ignored.

    `parse_line(line) -> (label, value) | None`. Only lines ended by a newline count: a prefix cut inside
    `x = 17` must not collect `x = 1` (the trainer keeps the best progress seen, so a transient match would
    stick), and with it the statements of any text only grow with its prefixes. Taking the first line stops a
    policy from collecting a point by listing many candidate answers.
    """
    found: dict[Any, Any] = {}
    for line in text.split("\n")[:-1]:
        if len(line) > 2000:  # nothing we generate is this long; bounds the parsers' work on garbage
            continue
        line = line.rstrip("\r")
        parsed = parse_line(line)
        if parsed is not None and parsed[0] not in found:
            found[parsed[0]] = parsed[1]
    return found


__all__ = ["ENV_NAMES", "SyntheticEnv", "build_row", "check_row", "first_statements", "get_env", "load_task",
           "make_dataset"]
