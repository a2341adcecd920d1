"""multi_add env: row contract, positional points, strict outcome (termination trap), adversarial completions."""

from __future__ import annotations

import json
import random

import pytest

from ppm_trl.envs import check_row, get_env, make_dataset
from ppm_trl.envs.multi_add import MultiAddEnv
from ppm_trl.scorers import reasoning_graph_of

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

def _row(pairs):
    """A hand-made row for the pairs (no generator involved)."""
    n = len(pairs)
    return {"task": json.dumps({"pairs": pairs}), "reasoning_points": ["p"] * (n + 1),
            "reasoning_graph": [{"if_all": [n + 1], "makes_obsolete": list(range(1, n + 1))}]}


ROW = _row([[3, 5], [7, 8], [0, 0]])  # sums 8, 15, 0
GOOD = "a:3+5=8\nb:7+8=15\nc:0+0=0\n\\boxed{a=8,b=15,c=0}"
env = MultiAddEnv()


def test_generated_rows_follow_the_contract_and_are_deterministic():
    data = make_dataset("multi_add", 5, 20, seed=3)
    assert data.to_list() == make_dataset("multi_add", 5, 20, seed=3).to_list()
    assert data.to_list() != make_dataset("multi_add", 5, 20, seed=4).to_list()
    for index, row in enumerate(data):
        check_row(get_env("multi_add"), row, index)  # reference verifies and reaches all n + 1 points
        pairs = json.loads(row["task"])["pairs"]
        assert len(pairs) == 5 and row["n"] == 5 and len(row["reasoning_points"]) == 6
        assert all(0 <= a <= 9 and 0 <= b <= 9 for a, b in pairs)
        assert row["prompt"][0]["content"].endswith("\n".join(f"{lab}:{a}+{b}" for lab, (a, b) in zip("abcde", pairs)))
        assert row["answer"] == ",".join(f"{lab}={a + b}" for lab, (a, b) in zip("abcde", pairs))
        assert row["reasoning_graph"] == [{"if_all": [6], "makes_obsolete": [1, 2, 3, 4, 5]}]


def test_reference_restates_each_pair_next_to_its_sum():
    row = make_dataset("multi_add", 3, 1, seed=0)[0]
    pairs = json.loads(row["task"])["pairs"]
    expected = [f"{lab}:{a}+{b}={a + b}" for lab, (a, b) in zip("abc", pairs)]
    expected.append("\\boxed{" + ",".join(f"{lab}={a + b}" for lab, (a, b) in zip("abc", pairs)) + "}")
    assert row["reference"].split("\n") == expected


def test_points_are_positional_complete_lines():
    assert env.match_points(ROW, GOOD) == {1, 2, 3, 4}
    assert env.match_points(ROW, "a:3+5=8\nb:7+8=14\nc:0+0=0\n") == {1, 3}  # line 2 wrong
    assert env.match_points(ROW, "b:7+8=15\na:3+5=8\nc:0+0=0\n") == {3}  # right sums, wrong positions
    assert env.match_points(ROW, "a:3+5=8\nc:0+0=0\n") == {1}  # skipping line 2 shifts line 3
    assert env.match_points(ROW, " a : 3 + 5 = 8 \n") == {1}  # spaces are tolerated
    assert env.match_points(ROW, "a:3+5=9\n") == set()
    assert env.match_points(ROW, "a:3+6=9\n") == set()  # the pair must be restated correctly
    assert env.match_points(ROW, "b:3+5=8\n") == set()  # and under its own label
    assert env.match_points(ROW, "3+5=8\n") == set()


def test_prefix_cut_inside_a_number_earns_nothing():
    # "b:7+8=1" is a prefix of "b:7+8=15"; 1 is a wrong answer, and an unfinished line never counts anyway.
    assert env.match_points(ROW, "a:3+5=8\nb:7+8=1") == {1}
    assert env.match_points(ROW, "a:3+5=8\nb:7+8=15") == {1}
    assert env.match_points(ROW, "a:3+5=8\nb:7+8=15\n") == {1, 2}


LINES = "a:3+5=8\nb:7+8=15\nc:0+0=0\n"


@pytest.mark.parametrize("text", [
    GOOD + "\na:3+5=8",  # junk after the box: the termination trap
    GOOD + "x",
    LINES + "d:1+1=2\n\\boxed{a=8,b=15,c=0}",  # an extra line
    LINES,  # no box
    LINES + "\\boxed{a=8,b=15}",  # box missing a sum
    LINES + "\\boxed{a=8,b=15,c=0,d=0}",
    LINES + "\\boxed{8,15,0}",  # unlabelled box
    LINES + "\\boxed{b=15,a=8,c=0}",  # box out of order
    "a:3+5=8\nb:7+8=15\nc:0+0=1\n\\boxed{a=8,b=15,c=0}",  # box right, a line wrong
    "a:3+5=8\nb:7+8=15\n\\boxed{a=8,b=15,c=0}",  # a line missing
    LINES + "\\boxed{a=8,b=15,c=0}\\boxed{a=8,b=15,c=0}",
    "\\boxed{a=8,b=15,c=0}",
])
def test_outcome_is_strict(text):
    assert not env.verify(ROW, text)
    assert 4 not in env.match_points(ROW, text)


def test_outcome_accepts_surrounding_whitespace_and_spaces_in_the_box():
    assert env.verify(ROW, "\n" + GOOD + "\n  ")
    assert env.verify(ROW, GOOD.replace("{a=8,b=15,c=0}", "{a = 8, b=15 ,c=0}"))


def test_goal_only_graph_gives_full_progress_only_with_the_outcome():
    graph = reasoning_graph_of(ROW)
    assert graph.progress(env.match_points(ROW, "a:3+5=8\nb:7+8=15\n")) == pytest.approx(2 / 4)
    assert graph.progress(env.match_points(ROW, GOOD)) == 1.0


def test_garbage_never_raises():
    rng = random.Random(0)
    alphabet = "0123456789+=:abc\n\\boxed{},x "
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert env.match_points(ROW, text) <= {1, 2, 3, 4}
    assert env.match_points(ROW, "9" * 5000 + "\n") == set()


def test_horizon_beyond_the_labels_is_a_clear_error():
    with pytest.raises(ValueError, match="n <= 26"):
        make_dataset("multi_add", 27, 1)


def test_row_without_pairs_is_a_clear_error():
    with pytest.raises(ValueError, match="pairs"):
        env.match_points({"task": json.dumps({"other": 1})}, GOOD)


# ------------------------------------------------------------------------------------------ any-order variant
def test_any_order_accepts_every_order_of_the_right_lines_and_nothing_else():
    from ppm_trl.envs import get_env

    env = get_env("multi_add_any_order")
    rows = make_dataset("multi_add_any_order", 4, 20, seed=3)
    orders = set()
    for row in rows:
        lines = row["reference"].split("\n")
        orders.add(tuple(line[0] for line in lines[:-1]))
        assert env.verify(row, row["reference"]) and env.match_points(row, row["reference"]) == {1, 2, 3, 4, 5}
        in_label_order = "\n".join(sorted(lines[:-1]) + [lines[-1]])
        assert env.verify(row, in_label_order)  # another order: correct too
        assert env.match_points(row, "\n".join(lines[:2]) + "\n") == {ord(line[0]) - ord("a") + 1 for line in lines[:2]}
        twice = "\n".join([lines[0], lines[0]] + lines[2:])  # a label twice, one missing
        assert not env.verify(row, twice)
        box_reordered = lines[-1].replace("a=", "A=")
        assert not env.verify(row, "\n".join(lines[:-1] + [box_reordered]))
    assert len(orders) > 5  # the references themselves come in varied orders (what the warm start imitates)


# ------------------------------------------------------------------------------------------ boxed-outcome variant
def test_boxed_variant_grades_the_box_and_only_the_form_of_the_work_lines():
    from ppm_trl.envs import get_env
    from ppm_trl.papo.process_scorers import ProgrammaticProcessScorer

    env = get_env("multi_add_boxed")
    row = make_dataset("multi_add_boxed", 3, 1, seed=5)[0]
    lines = row["reference"].split("\n")
    assert env.verify(row, row["reference"]) and env.match_points(row, row["reference"]) == {1, 2, 3, 4}
    label, rest = lines[1].split(":")
    pair, total = rest.split("=")
    flawed = "\n".join([lines[0], f"{label}:{pair}={int(total) + 1}", lines[2], lines[3]])
    assert env.verify(row, flawed)  # a wrong work line, the right box: correct
    assert env.match_points(row, flawed) == {1, 3, 4}  # ... but line 2 is not a reached point
    # PAPO's programmatic process score: the right answer after flawed work scores below the reference
    assert ProgrammaticProcessScorer()([row, row], [flawed, row["reference"]]) == [pytest.approx(3 / 4), 1.0]
    # Form still counts: another operand, a missing line, a wrong box sum, anything after the box
    assert not env.verify(row, flawed.replace(f"{label}:{pair}", f"{label}:{pair}1"))
    assert not env.verify(row, "\n".join([lines[0], lines[2], lines[3]]))
    box_sums = lines[3]
    wrong_box = box_sums.replace("a=", "a=1", 1)
    assert not env.verify(row, "\n".join(lines[:3] + [wrong_box]))
    assert not env.verify(row, row["reference"] + "\nmore")
    # multi_add itself rejects the flawed answer: its outcome checks the lines
    assert not get_env("multi_add").verify(row, flawed)


def test_boxed_warm_start_references_keep_the_true_sums_in_the_box():
    import random

    from ppm_trl.demo.warmstart import with_line_errors
    from ppm_trl.envs import get_env

    rows = make_dataset("multi_add_boxed", 4, 50, seed=1)
    noisy_written = [with_line_errors(r["reference"], 0.4, random.Random(i)) for i, r in enumerate(rows)]
    noisy_true = [with_line_errors(r["reference"], 0.4, random.Random(i), true_box=True) for i, r in enumerate(rows)]
    env = get_env("multi_add_boxed")
    # Same rng draws: the same work lines either way; only the box differs
    assert all(a.split("\n")[:-1] == b.split("\n")[:-1] for a, b in zip(noisy_written, noisy_true))
    assert all(env.verify(row, text) for row, text in zip(rows, noisy_true))
    wrong_lines = sum(4 - len(env.solved_lines(row, text)) for row, text in zip(rows, noisy_true))
    assert 0.25 < wrong_lines / (4 * len(rows)) < 0.55  # ~40 % of the work lines are wrong
    assert sum(env.verify(row, text) for row, text in zip(rows, noisy_written)) < len(rows) // 2
