"""Reasoning points and obsoletion graphs a dataset already has, read instead of asking a judge.

The PPM paper's Polaris data (`prestonfu/polaris-acemath-gemini-rubrics-v2`) ships its rubric as one string of
numbered lines (`"1. ...\\n2. ..."`) and its graphs as Python-literal pairs (`"[([2], [1]), ([3, 4], [2])]"`, one
column per density: `makes_obsolete_sparse`, `_medium`, `_dense`). `ppm-trl prepare --points-column rubric
--graph-column makes_obsolete_dense` turns them into `prepare`'s own columns (`reasoning_points`, `reasoning_graph`
records) with no judge call. A list of strings, a list of `{"if_all", "makes_obsolete"}` records or a list of pairs
is read as well. Every cell is checked as a judge's answer is (`ReasoningGraph`: items in range, no rule obsoleting
its own premise); a cell that cannot be read names its row and column.

PPM's last point states the final answer (App. D; `prepare` asks the judge for exactly that). A given rubric whose
last point does not state the gold answer gets one more point, `The final answer is \\boxed{<answer>}.` — the paper's
code appends a final "answer in \\boxed{}" item to every Polaris rubric for the same reason. No rule names it, and
reaching it means every point is reached (the goal rule of `ReasoningGraph.closure`).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ppm_trl.judge import answers, parsing
from ppm_trl.points import ReasoningGraph

BAD_GIVEN_POINTS = "bad_given_points"  # failure kind of a row whose given points or graph cannot be read


def points_of(value: Any, column: str, index: int) -> list[str]:
    """The reasoning points of one cell: a list of strings, or numbered lines `1. ...` (a line without a number
    continues the item above, as in a judge's rubric)."""
    where = f"row {index}, column {column!r}"
    if isinstance(value, str):
        points = parsing.parse_rubric(f"<rubric>\n{value}\n</rubric>")
        if points is None:
            raise ValueError(f"{where}: not a numbered list of reasoning points ('1. ...', '2. ...' one per line): "
                             f"{value[:120]!r}")
        return points
    if isinstance(value, Sequence) and value and all(isinstance(point, str) for point in value):
        points = [point.strip() for point in value]
        if all(points):
            return points
    raise ValueError(f"{where}: expected reasoning points (a non-empty list of non-empty strings, or numbered lines), "
                     f"got {str(value)[:120]!r}")


def graph_of(value: Any, column: str, index: int, num_points: int) -> list[dict[str, list[int]]]:
    """The obsoletion rules of one cell as `prepare` writes them (1-based records); an empty cell has none."""
    where = f"row {index}, column {column!r}"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text or text.lower() == "nan":
            return []
        try:
            value = ast.literal_eval(text)  # literals only: never evaluates code
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"{where}: not a list of (if_all, makes_obsolete) pairs: {text[:120]!r}") from None
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], (tuple, Mapping)):
        value = [value]  # one rule written bare: ([2], [1])
    try:
        if isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(r, Mapping) for r in value):
            graph = ReasoningGraph.from_records(value, num_points)
        elif isinstance(value, Sequence) and not isinstance(value, str):
            graph = ReasoningGraph(num_points, [tuple(_items(part) for part in rule) if _is_pair(rule) else rule
                                                for rule in value])
        else:
            raise ValueError(f"expected a list of rules, got {str(value)[:120]!r}")
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return graph.to_records()


def with_answer_point(points: list[str], answer: str) -> tuple[list[str], bool]:
    """(`points`, whether a final-answer point was appended): PPM's last point states the gold answer."""
    if answers.states_answer(points[-1], answer):
        return points, False
    return [*points, f"The final answer is \\boxed{{{answer}}}."], True


def given_points_settings(args) -> None:
    """`--points-column` reads the points the dataset has: no judge runs, so judge flags are refused, not ignored."""
    if args.judge_model is not None:
        raise ValueError("--points-column reads the points the dataset already has and calls no judge: leave out "
                         f"--judge-model ({args.judge_model}), or leave out --points-column to have the judge write them")
    return None


def read_given_points(args, rows: list[dict[str, Any]], jobs, failures: dict[int, dict]) -> dict[int, dict]:
    """{row index: its points and graph} read from `--points-column` / `--graph-column` (`given_points`); a cell
    that cannot be read is a failure of its row (left out, listed), never a stop."""
    done: dict[int, dict[str, Any]] = {}
    appended = 0
    for index, _problem, _reference, answer in jobs:
        try:
            points = points_of(rows[index][args.points_column], args.points_column, index)
            points, added = with_answer_point(points, answer)
            graph = ([] if args.graph_column is None else
                     graph_of(rows[index][args.graph_column], args.graph_column, index, len(points)))
        except ValueError as error:
            failures[index] = {"stage": "points", "kind": BAD_GIVEN_POINTS, "reason": str(error)}
            continue
        appended += added
        done[index] = {"reasoning_points": points, "reasoning_graph": graph}
    print(f"prepare: points from column {args.points_column!r}"
          + (f", graphs from {args.graph_column!r}" if args.graph_column else ", no obsoletion rules (--graph-column)")
          + f" for {len(done)} row(s), no judge call; a final-answer point appended to {appended} whose last point "
          "does not state the gold answer")
    return done


def _is_pair(rule: Any) -> bool:
    return isinstance(rule, Sequence) and not isinstance(rule, str) and len(rule) == 2


def _items(part: Any) -> Any:
    """An item number written bare (`([2], 1)`) as a one-item list; anything else is left to `ReasoningGraph`."""
    return [part] if isinstance(part, int) and not isinstance(part, bool) else part
