"""chain_add env: the sequential counterpart of multi_add — running values mod 10, chain graph, strict outcome."""

from __future__ import annotations

import json
import random

import pytest

from ppm_trl.envs import check_row, get_env, make_dataset
from ppm_trl.envs.chain_add import ChainAddEnv, running_values
from ppm_trl.scorers import reasoning_graph_of

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

env = ChainAddEnv()


def _row(start, addends):
    n = len(addends)
    return {"task": json.dumps({"start": start, "addends": addends}), "reasoning_points": ["p"] * (n + 1),
            "reasoning_graph": [{"if_all": [k], "makes_obsolete": list(range(1, k))} for k in range(2, n + 2)]}


ROW = _row(3, [5, 4, 7])  # values 8, 2 (12 mod 10), 9
GOOD = "a:5+3=8\nb:4+8=2\nc:7+2=9\n\\boxed{9}"


def test_running_values_wrap_mod_10():
    assert running_values(3, [5, 4, 7]) == [8, 2, 9]
    assert running_values(9, [9, 9]) == [8, 7]


def test_generated_rows_follow_the_contract_and_are_deterministic():
    data = make_dataset("chain_add", 6, 20, seed=3)
    assert data.to_list() == make_dataset("chain_add", 6, 20, seed=3).to_list()
    for index, row in enumerate(data):
        check_row(get_env("chain_add"), row, index)  # reference verifies and reaches all n + 1 points
        task = json.loads(row["task"])
        values = running_values(task["start"], task["addends"])
        assert row["answer"] == str(values[-1]) and row["reference"].endswith(f"\\boxed{{{values[-1]}}}")
        assert len(row["reasoning_points"]) == 7
        assert row["reasoning_graph"][-1] == {"if_all": [7], "makes_obsolete": [1, 2, 3, 4, 5, 6]}


def test_points_need_the_true_running_value():
    assert env.match_points(ROW, GOOD) == {1, 2, 3, 4}
    # Line 1 wrong: line 2 carries the wrong value consistently — still not the true step 2.
    assert env.match_points(ROW, "a:3+5=8\n") == set()  # running value first: the old order is not accepted
    assert env.match_points(ROW, "a:5+3=9\nb:4+9=3\nc:7+2=9\n") == {3}
    assert env.match_points(ROW, "a:5+3=8\nb:4+8=12\n") == {1}  # no mod: wrong
    assert env.match_points(ROW, "a:5+3=8\nb:4+8=2") == {1}  # unfinished line
    assert env.match_points(ROW, "b:4+8=2\n") == set()  # positional


def test_chain_graph_progress_is_the_furthest_step():
    graph = reasoning_graph_of(ROW)
    # Step 3 right by itself makes steps 1-2 obsolete: progress 3 / 4 (the paper's sequential graph).
    assert graph.progress(env.match_points(ROW, "a:5+3=9\nb:4+9=3\nc:7+2=9\n")) == pytest.approx(3 / 4)
    assert graph.progress(env.match_points(ROW, "a:5+3=8\n")) == pytest.approx(1 / 4)
    assert graph.progress(env.match_points(ROW, GOOD)) == 1.0


@pytest.mark.parametrize("text", [
    GOOD + "\nx",  # junk after the box
    "a:5+3=8\nb:4+8=2\nc:7+2=9\n",  # no box
    "a:5+3=8\nb:4+8=2\nc:7+2=9\n\\boxed{8}",  # wrong final value
    "a:5+3=8\nb:4+8=3\nc:7+2=9\n\\boxed{9}",  # a line wrong, box right
    "a:5+3=8\nc:7+2=9\n\\boxed{9}",  # a line missing
    "\\boxed{9}",
])
def test_outcome_is_strict(text):
    assert not env.verify(ROW, text)
    assert 4 not in env.match_points(ROW, text)


def test_garbage_never_raises_and_bad_rows_are_named():
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("0123456789+=:abc\n\\boxed{} ") for _ in range(rng.randint(0, 60)))
        assert env.match_points(ROW, text) <= {1, 2, 3, 4}
    with pytest.raises(ValueError, match="start"):
        env.match_points({"task": json.dumps({"addends": [1]})}, GOOD)
    with pytest.raises(ValueError, match="n <= 26"):
        make_dataset("chain_add", 27, 1)
