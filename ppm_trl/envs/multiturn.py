"""Multi-turn `multi_countdown` and `matrix` for TRL's environment/tool loop (PPM paper §5.1, App. B.2, App. C).

In the paper each turn presents the next sub-problem (one Countdown problem, one matrix operation) with its own
token budget, and PPM rewards each turn (`segmentation="turns"`). In TRL 1.16 a multi-turn rollout is a tool loop
(`GRPOTrainer(environment_factory=...)`): the model ends a turn by calling a tool, the tool's result is appended to the
rollout (`tool_mask` 0) and generation continues. So here:

* the prompt states the protocol and sub-problem 1; in each turn the model writes its answer line in the single-turn
  format (`Pk: <expression> = <target>` / `Mk: <matrix>`), then calls `next_problem()` / `next_operation()`, whose
  result is the next sub-problem; after the last one it writes the final `\\boxed{}` answer instead of calling.
* the tool takes no argument: as in the paper, a turn's answer is its text and the call only ends the turn, so the
  answer is graded where the single-turn matcher reads it and nothing has to be said twice.
* scoring is the single-turn env's. Rows keep every column of `make_dataset(name, n, size, seed)` (same problems,
  same `answer`, `reference`, `reasoning_points`, `reasoning_graph`, `env`, `task`); only `prompt` changes, and
  `subproblems` (the text of each sub-problem, for `reset`) and `environment` (for a dict `environment_factory`) are
  added. The matcher reads the decoded completion, turns and tool results together; a tool result never contains an
  answer line or a `\\boxed{}`, so environment text cannot reach a point (tested).

A rollout of n sub-problems has n turns: use `num_segments=n`; `multiturn_config_kwargs` gives the config fields,
including the per-turn token budget.
"""

from __future__ import annotations

import re
from typing import Any

from ppm_trl.envs import load_task, make_dataset

MULTITURN_ENV_NAMES = ("multi_countdown", "matrix")
_NO_MORE = "There is no next {item}: all {n} {item}s were given. Write the final answer now."


def _countdown_subproblems(row: dict[str, Any]) -> list[str]:
    problems = load_task(row)["problems"]
    n = len(problems)
    return [
        f"Problem {k} of {n}: numbers {' '.join(map(str, p['numbers']))}, target {p['target']}"
        + (" (the last one)" if k == n else "")
        for k, p in enumerate(problems, start=1)
    ]


def _countdown_prompt(row: dict[str, Any], subproblems: list[str]) -> str:
    n = len(subproblems)
    return (
        f"Solve {n} Countdown problem{'s' if n > 1 else ''}, one per turn. For each, combine its four numbers with "
        "+ - * / and parentheses, using every number exactly once, to reach the target. Answer each problem with one "
        "line `Pk: <expression> = <target>`, then call `next_problem` to get the next problem. After the line of the "
        "last problem, do not call the tool: write the targets of all problems as \\boxed{t1, t2, ...}.\n"
        + subproblems[0]
    )


_MATRIX_START = re.compile(r"^Matrix: (\[\[.*\]\])$")
_MATRIX_OPERATION = re.compile(r"^(\d+)\. (.+)$")


def _matrix_start_and_operations(row: dict[str, Any]) -> tuple[str, list[str]]:
    """The start matrix and the operations, read from the single-turn prompt (`task` holds only the results)."""
    text = row["prompt"][-1]["content"]
    lines = text.split("\n")
    starts = [m.group(1) for m in map(_MATRIX_START.match, lines) if m]
    operations = [m for m in map(_MATRIX_OPERATION.match, lines) if m]
    n = len(load_task(row)["matrices"])
    if len(starts) != 1 or [int(m.group(1)) for m in operations] != list(range(1, n + 1)):
        raise RuntimeError(f"the matrix prompt no longer has a `Matrix: ...` line and operations 1..{n}:\n{text}")
    return starts[0], [m.group(2) for m in operations]


def _matrix_subproblems(row: dict[str, Any]) -> list[str]:
    _, operations = _matrix_start_and_operations(row)
    n = len(operations)
    return [f"Operation {k} of {n}: {op}" + (" (the last one)" if k == n else "")
            for k, op in enumerate(operations, start=1)]


def _matrix_prompt(row: dict[str, Any], subproblems: list[str]) -> str:
    start, _ = _matrix_start_and_operations(row)
    n = len(subproblems)
    return (
        f"Apply {n} operation{'s' if n > 1 else ''} to the matrix in order, one per turn. After operation k write one "
        "line `Mk: <matrix>` in the same [[row],[row]] format, then call `next_operation` to get the next operation. "
        "After the line of the last operation, do not call the tool: write the final matrix as \\boxed{<matrix>}.\n"
        f"Matrix: {start}\n" + subproblems[0]
    )


_BUILDERS = {
    "multi_countdown": (_countdown_subproblems, _countdown_prompt),
    "matrix": (_matrix_subproblems, _matrix_prompt),
}


def make_multiturn_dataset(name: str, n: int, size: int, seed: int = 0):
    """`make_dataset(name, n, size, seed)` in multi-turn form: one sub-problem per turn (columns: module docstring)."""
    if name not in _BUILDERS:
        raise ValueError(f"no multi-turn form of env {name!r}; accepted names: {', '.join(MULTITURN_ENV_NAMES)}")
    from datasets import Dataset, List, Value

    subproblems_of, prompt_of = _BUILDERS[name]
    single_turn = make_dataset(name, n, size, seed)
    rows = []
    for row in single_turn:
        subproblems = subproblems_of(row)
        row["prompt"] = [{"role": "user", "content": prompt_of(row, subproblems)}]
        rows.append({**row, "subproblems": subproblems, "environment": name})
    features = single_turn.features.copy()
    features.update({"subproblems": List(Value("string")), "environment": Value("string")})
    return Dataset.from_list(rows, features=features)


class _SubProblemEnv:
    """One rollout's state: which of the row's sub-problems have been shown. The prompt shows sub-problem 1."""

    task = ""
    item = ""

    def __init__(self):
        self.subproblems: list[str] = []
        self.shown = 0
        self.extra_calls = 0  # calls after the last sub-problem (diagnostics)

    def reset(self, **row) -> None:
        if row.get("env") != self.task:
            raise ValueError(f"{type(self).__name__} serves env {self.task!r} rows, got env={row.get('env')!r}; "
                             "build the dataset with make_multiturn_dataset")
        subproblems = row.get("subproblems")
        if not isinstance(subproblems, list) or not subproblems or not all(isinstance(s, str) for s in subproblems):
            raise ValueError(f"column `subproblems` must be a non-empty list of strings (make_multiturn_dataset), "
                             f"got {subproblems!r}")
        self.subproblems = list(subproblems)
        self.shown = 1
        self.extra_calls = 0
        return None  # the prompt already presents sub-problem 1

    def _advance(self) -> str:
        if self.shown >= len(self.subproblems):
            self.extra_calls += 1
            return _NO_MORE.format(item=self.item, n=len(self.subproblems))
        self.shown += 1
        return self.subproblems[self.shown - 1]


class MultiCountdownTurnEnv(_SubProblemEnv):
    """Multi-turn Multi-Countdown: each `next_problem` call presents the next Countdown problem."""

    task = "multi_countdown"
    item = "problem"

    def next_problem(self) -> str:
        """Finish the current Countdown problem and get the next one.

        Call this after writing the line `Pk: <expression> = <target>` for the current problem.

        Returns:
            The next problem: its four numbers and its target.
        """
        return self._advance()


class MatrixTurnEnv(_SubProblemEnv):
    """Multi-turn Matrix Manipulation: each `next_operation` call presents the next operation."""

    task = "matrix"
    item = "operation"

    def next_operation(self) -> str:
        """Finish the current matrix operation and get the next one.

        Call this after writing the line `Mk: <matrix>` with the matrix after the current operation.

        Returns:
            The next operation to apply to the current matrix.
        """
        return self._advance()


# A dict `environment_factory` (TRL routes each row by its `environment` column) mixes both tasks in one run.
MULTITURN_ENVIRONMENTS = {"multi_countdown": MultiCountdownTurnEnv, "matrix": MatrixTurnEnv}


def multiturn_config_kwargs(n: int, tokens_per_turn: int, tool_tokens_per_turn: int = 128,
                            use_vllm: bool = False, method: str = "ppm") -> dict[str, Any]:
    """Config fields of `method` (a registered name) for n sub-problems with a per-turn budget (paper: 512 tokens per
    sub-problem).

    At most n - 1 tool calls; each generation call (one turn) capped at `tokens_per_turn`; the whole completion
    (turns + tool results, which TRL counts against `max_completion_length`; the tool loop stops a rollout whose next
    tool result would not fit) capped at n turns plus n - 1 tool results of at most `tool_tokens_per_turn` tokens.
    vLLM (colocate) reads the per-call cap as `max_tokens`, HF generate as `max_new_tokens`. Then the method's own
    fields (`Method.multiturn_fields`; PPM: one segment per turn, `segmentation="turns"`, `num_segments=n`).
    """
    from ppm_trl.registry import get_method

    for value, what in ((n, "n"), (tokens_per_turn, "tokens_per_turn"), (tool_tokens_per_turn, "tool_tokens_per_turn")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return {
        "max_tool_calling_iterations": n - 1,
        "max_completion_length": n * tokens_per_turn + (n - 1) * tool_tokens_per_turn,
        "generation_kwargs": {("max_tokens" if use_vllm else "max_new_tokens"): tokens_per_turn},
        **get_method(method).multiturn_settings(n),
    }


__all__ = ["MULTITURN_ENVIRONMENTS", "MULTITURN_ENV_NAMES", "MatrixTurnEnv", "MultiCountdownTurnEnv",
           "make_multiturn_dataset", "multiturn_config_kwargs"]
