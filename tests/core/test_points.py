"""ReasoningGraph: shortcut closure (PPM §4), App. C GSM-Infinite example, App. D XML format, validation."""

from __future__ import annotations

import math

import pytest
import torch

from ppm_trl.points import ReasoningGraph, progress_matrix

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

GSM_RULES = [([2], [1]), ([3], [2]), ([4], [3])]  # App. C: "[([2],[1]),([3],[2]),([4],[3])]"

APP_D_OUTPUT = """Item 4 obsoletes items 2 and 3 because identifying the leading term ... (4 sentences max)

<makes_obsolete_graph>
<rule if_all="4" makes_obsolete="2,3"/>
<rule if_all="6" makes_obsolete="4,5"/>
<rule if_all="7" makes_obsolete="6"/>
<rule if_all="9" makes_obsolete="8"/>
<rule if_all="10" makes_obsolete="7,9"/>
</makes_obsolete_graph>
"""


# ------------------------------------------------------------------------------------------------- closure
def test_gsm_infinite_example_from_paper():
    graph = ReasoningGraph(4, GSM_RULES)
    # Item 3 reached: rule 3→2 then 2→1 fire, so {1,2,3} of 4 points.
    assert graph.closure({3}) == frozenset({1, 2, 3})
    assert graph.progress({3}) == 3 / 4
    # Item 4 is the goal: everything is reached.
    assert graph.progress({4}) == 1.0
    # Without shortcutting only item 3 itself counts.
    assert graph.progress({3}, shortcut=False) == 1 / 4
    assert graph.closure({3}, shortcut=False) == frozenset({3})


def test_multi_premise_rule_needs_all_premises_and_chains_propagate():
    # n = 6: 2 and 3 together obsolete 1; 4 obsoletes 2 and 3; 5 obsoletes 4; 6 is the goal.
    graph = ReasoningGraph(6, [([2, 3], [1]), ([4], [2, 3]), ([5], [4])])
    assert graph.closure({3}) == frozenset({3})  # 2 missing: rule 0 does not fire
    assert graph.progress({2, 3}) == 3 / 6  # {1, 2, 3}
    # 5 → 4 → {2, 3} → 1: a three-step chain, {1, 2, 3, 4, 5} = 5 of 6.
    assert graph.closure({5}) == frozenset({1, 2, 3, 4, 5})
    assert graph.progress({5}) == 5 / 6
    assert graph.progress(set()) == 0.0


def test_goal_makes_everything_reached_even_without_rules():
    graph = ReasoningGraph(5, [])
    assert graph.closure({5}) == frozenset({1, 2, 3, 4, 5})
    assert graph.progress({5}, shortcut=False) == 1 / 5
    assert graph.progress({1, 4}) == 2 / 5


def test_rule_obsoleting_the_goal_counts_as_reaching_it():
    graph = ReasoningGraph(3, [([2], [3])])
    assert graph.progress({2}) == 1.0  # 2 ⇒ 3 = goal ⇒ all


def test_closure_rejects_out_of_range_items():
    graph = ReasoningGraph(4, GSM_RULES)
    for bad in ({0}, {5}, {True}, {"2"}):
        with pytest.raises(ValueError, match="1..4"):
            graph.closure(bad)


def test_progress_batch_marks_none_as_nan_and_caches():
    graph = ReasoningGraph(4, GSM_RULES)
    values = graph.progress_batch([{3}, None, {4}, {3}], dtype=torch.float64)
    assert values.dtype == torch.float64
    assert values[0] == 0.75 and math.isnan(values[1]) and values[2] == 1.0 and values[3] == 0.75
    assert 0b0100 in graph._cache  # {3} as a bitmask was memoised


def test_progress_matrix_uses_each_rows_graph():
    chain = ReasoningGraph(4, GSM_RULES)
    flat = ReasoningGraph(4, [])
    matrix = progress_matrix([chain, flat], [[{1}, {3}], [{3}, None]])
    assert matrix.shape == (2, 2)
    assert matrix[0].tolist() == [0.25, 0.75]
    assert matrix[1, 0] == 0.25 and math.isnan(matrix[1, 1])
    with pytest.raises(ValueError, match="same number of prefixes"):
        progress_matrix([chain, flat], [[{1}], [{1}, {2}]])


# ------------------------------------------------------------------------------------------------- parsing
def test_from_xml_app_d_example():
    graph = ReasoningGraph.from_xml(APP_D_OUTPUT, 10)
    assert graph.rules == (((4,), (2, 3)), ((6,), (4, 5)), ((7,), (6,)), ((9,), (8,)), ((10,), (7, 9)))
    # 7 ⇒ 6 ⇒ {4, 5} ⇒ {2, 3}: {2, ..., 7} = 6 of 10.
    assert graph.progress({7}) == 6 / 10


def test_from_xml_tolerates_quotes_whitespace_order_and_no_wrapper():
    text = "< rule  makes_obsolete = '1, 2'   if_all='3' />\n<rule if_all=\"4\"\n makes_obsolete=3>"
    graph = ReasoningGraph.from_xml(text, 4)
    assert graph.rules == (((3,), (1, 2)), ((4,), (3,)))


def test_from_xml_uses_last_complete_block_and_empty_graph():
    text = ("<makes_obsolete_graph><rule if_all=\"2\" makes_obsolete=\"1\"/></makes_obsolete_graph> final:\n"
            "<makes_obsolete_graph>\n<rule if_all=\"3\" makes_obsolete=\"1\"/>\n</makes_obsolete_graph>")
    assert ReasoningGraph.from_xml(text, 3).rules == (((3,), (1,)),)
    assert ReasoningGraph.from_xml("<makes_obsolete_graph>\n</makes_obsolete_graph>", 3).rules == ()
    assert ReasoningGraph.from_xml("  \n", 3).rules == ()


@pytest.mark.parametrize(
    "text, message",
    [
        ("<makes_obsolete_graph>\n<rule if_all=\"2\" makes_obsolete=\"1\"/>", "never closed"),
        ("<rule if_all=\"2\"/>", "missing \\['makes_obsolete'\\]"),
        ("<rule if_all=\"2\" makes_obsolete=\"1,x\"/>", "comma-separated"),
        ("<rule if_all=\"2\" makes_obsolete=\"\"/>", "comma-separated"),
        ("<rule if_all=\"2\" makes_obsolete=\"1\" oops/>", "cannot read 'oops'"),
        ("<rule if_all=\"2\" makes_obsolete=\"1\" weight=\"3\"/>", "unknown attribute\\(s\\) \\['weight'\\]"),
        ("<rule if_all=\"2\" makes_obsolete=\"1\"", "not closed"),
        ("Sorry, I cannot produce a graph.", "no <rule"),
        ("<rule if_all=\"5\" makes_obsolete=\"1\"/>", "out of range"),
    ],
)
def test_from_xml_errors(text, message):
    with pytest.raises(ValueError, match=message):
        ReasoningGraph.from_xml(text, 4)


def test_records_and_xml_round_trip():
    records = [{"if_all": [2, 3], "makes_obsolete": [1]}, {"if_all": [4], "makes_obsolete": [3, 2]}]
    graph = ReasoningGraph.from_records(records, 5)
    assert graph.to_records() == [{"if_all": [2, 3], "makes_obsolete": [1]}, {"if_all": [4], "makes_obsolete": [2, 3]}]
    assert ReasoningGraph.from_xml(graph.to_xml(), 5) == graph
    assert ReasoningGraph.from_records(graph.to_records(), 5) == graph


def test_from_records_errors():
    with pytest.raises(ValueError, match="rule 1"):
        ReasoningGraph.from_records([{"if_all": [2], "makes_obsolete": [1]}, {"if_all": [3]}], 4)
    with pytest.raises(ValueError, match="list of"):
        ReasoningGraph.from_records(None, 4)
    with pytest.raises(ValueError, match="not an integer"):
        ReasoningGraph.from_records([{"if_all": [2.5], "makes_obsolete": [1]}], 4)


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "rules, message",
    [
        ([([2], [1]), ([5], [1])], r"rule 1 \(if_all=\[5\], makes_obsolete=\[1\]\): item 5 is out of range; items are 1..4"),
        ([([0], [1])], r"rule 0 .*item 0 is out of range"),
        ([([2], [1]), ([], [1])], r"rule 1 .*if_all is empty"),
        ([([2], [])], r"rule 0 .*makes_obsolete is empty"),
        ([([2, 3], [3])], r"rule 0 \(if_all=\[2, 3\], makes_obsolete=\[3\]\): obsoletes its own premise item\(s\) \[3\]"),
        ([([2], [1], [3])], r"rule 0 .*pair"),
    ],
)
def test_invalid_rules_name_the_rule(rules, message):
    with pytest.raises(ValueError, match=message):
        ReasoningGraph(4, rules)


@pytest.mark.parametrize("num_points", [0, -3, 2.5, True])
def test_invalid_num_points(num_points):
    with pytest.raises(ValueError, match="num_points"):
        ReasoningGraph(num_points, [])
