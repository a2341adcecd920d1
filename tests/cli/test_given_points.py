"""`prepare --points-column/--graph-column` (ppm_trl/prepare/given_points.py): the points and graphs a dataset
already has, in the PPM authors' Polaris format and ours, read as a judge's answer is checked — every unreadable
cell names its row and column, nothing is guessed."""

from __future__ import annotations

import math

import pytest

from ppm_trl.prepare.given_points import graph_of, points_of, with_answer_point


def test_points_from_numbered_lines_lists_and_wrapped_lines():
    assert points_of("1. Computes 3 * 4 = 12.\n2. Adds 2 to get 14.", "rubric", 0) == [
        "Computes 3 * 4 = 12.", "Adds 2 to get 14."]
    assert points_of("\n1) First.\n   continued here\n\n2) Second.\n", "rubric", 0) == [
        "First. continued here", "Second."]
    assert points_of([" First. ", "Second."], "points", 0) == ["First.", "Second."]


@pytest.mark.parametrize("cell", ["", "Just prose, no numbers.", "1. One.\n3. Three.", "2. Starts at two.", [],
                                  ["ok", ""], ["ok", 3], None, 7])
def test_unreadable_points_name_the_row_and_column(cell):
    with pytest.raises(ValueError, match=r"row 4, column 'rubric'"):
        points_of(cell, "rubric", 4)


def test_graphs_in_the_authors_format_and_ours():
    records = [{"if_all": [2], "makes_obsolete": [1]}, {"if_all": [3, 4], "makes_obsolete": [1, 2]}]
    assert graph_of("[([2], [1]), ([3, 4], [1, 2])]", "g", 0, 4) == records
    assert graph_of([[[2], [1]], [[3, 4], [1, 2]]], "g", 0, 4) == records  # pairs as lists (JSON)
    assert graph_of(records, "g", 0, 4) == records  # prepare's own records
    assert graph_of("([2], 1)", "g", 0, 2) == [{"if_all": [2], "makes_obsolete": [1]}]  # one bare rule, a bare item
    assert graph_of("[(2, 1)]", "g", 0, 2) == [{"if_all": [2], "makes_obsolete": [1]}]
    for empty in ("", "  ", "nan", "[]", None, math.nan, []):
        assert graph_of(empty, "g", 0, 3) == []


@pytest.mark.parametrize("cell, says", [
    ("[([1], [5])]", "item 5 is out of range; items are 1..3"),
    ("[([2], [2])]", "obsoletes its own premise"),
    ("[([], [1])]", "if_all is empty"),
    ("__import__('os').system('true')", "not a list of (if_all, makes_obsolete) pairs"),  # never evaluated
    ("[([2], [1])", "not a list of (if_all, makes_obsolete) pairs"),  # torn
    ("{'a': 1}", "expected a list of rules"),
    ("[([2], [1], [3])]", "expected a pair"),
])
def test_unreadable_graphs_name_the_row_column_and_rule(cell, says):
    with pytest.raises(ValueError, match=r"row 7, column 'makes_obsolete_dense'") as error:
        graph_of(cell, "makes_obsolete_dense", 7, 3)
    assert says in str(error.value)


def test_the_answer_point_is_appended_only_when_the_last_point_does_not_state_the_answer():
    points = ["Computes 6 * 7 = 42.", "Adds 5."]
    assert with_answer_point(points, "47") == ([*points, "The final answer is \\boxed{47}."], True)
    stated = ["Computes 6 * 7 = 42.", "Adds 5 to get 47.0."]
    assert with_answer_point(stated, "47") == (stated, False)  # math-verify: 47.0 states 47
    assert with_answer_point(["The answer is $\\frac{1}{2}$."], "0.5") == (["The answer is $\\frac{1}{2}$."], False)
    wrong = ["Adds 5 to get 470."]
    assert with_answer_point(wrong, "47")[1] is True  # 470 does not pass for 47


@pytest.mark.parametrize("flags, says", [
    ([], "--judge-model is required"),
    (["--graph-column", "graph"], "--graph-column needs --points-column"),
    (["--points-column", "rubric", "--judge-model", "gemini/gemini-2.5-flash-lite"], "calls no judge: leave out"),
    (["--points-column", "rubrics"], "--points-column 'rubrics' is not a column"),
])
def test_prepare_flags_for_given_points_are_checked_before_any_work(tmp_path, flags, says):
    import json

    from ppm_trl.prepare import main

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "solution": "\\boxed{2}", "rubric": "1. It is 2.",
                                "graph": ""}) + "\n")
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        main(["--dataset", str(data), "--problem-column", "problem", "--reference-column", "solution",
              "--out", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_estimate_prepare_says_given_points_cost_nothing(tmp_path):
    import json

    from ppm_trl.estimate.prepare import estimate_prepare

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "solution": "\\boxed{2}", "rubric": "1. It is 2."}) + "\n")
    with pytest.raises(ValueError, match="calls no judge, so it costs no requests"):
        estimate_prepare(["--dataset", str(data), "--problem-column", "problem", "--reference-column", "solution",
                          "--points-column", "rubric", "--out", str(tmp_path / "out")])


def test_the_pushed_dataset_card_says_where_given_points_came_from():
    from argparse import Namespace

    from ppm_trl.prepare.hub_card import dataset_card

    args = Namespace(push_to_hub="me/polaris-points", dataset="prestonfu/polaris-acemath-gemini-rubrics-v2",
                     split="train_boxed", config_name=None, problem_column="problem",
                     reference_column="gemini_solution", answer_column="answer", judge_model=None,
                     points_column="rubric", graph_column="makes_obsolete_dense")
    card = dataset_card(args, kept=2286, total=2287, reasons="1 whose given points or graph cannot be read")
    assert "- Points from the source's column `rubric`, graphs from `makes_obsolete_dense`; no judge call" in card
    assert "Judge model" not in card
    assert "- Rows: 2286 of 2287 kept; left out 1 (1 whose given points or graph cannot be read)" in card
    assert "PPM's progress rewards (arXiv:2609.07303)" in card  # the PPM paper (it cited ARG's id before)
