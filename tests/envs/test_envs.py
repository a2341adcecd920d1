"""Synthetic envs: generation contract, hand-checked matchers, prefix monotonicity, fuzzing."""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppm_trl.envs import ENV_NAMES, get_env, make_dataset
from ppm_trl.envs.chain import ChainEnv
from ppm_trl.envs.matrix import MatrixEnv, _operations, parse_matrix
from ppm_trl.envs.multi_countdown import MultiCountdownEnv, evaluate
from ppm_trl.text import last_boxed

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

CORE = ("multi_countdown", "matrix", "chain")


def _num_points(row) -> int:
    return len(row["reasoning_points"])


def _rules_closure(row, reached: set[int]) -> set[int]:
    """The graph's rules alone, applied to a fixed point (no special goal rule)."""
    reached = set(reached)
    changed = True
    while changed:
        changed = False
        for rule in row["reasoning_graph"]:
            if set(rule["if_all"]) <= reached and not set(rule["makes_obsolete"]) <= reached:
                reached |= set(rule["makes_obsolete"])
                changed = True
    return reached


# ---- bad input ------------------------------------------------------------------------------------------------


def test_registry_lists_the_core_envs():
    assert set(CORE) <= set(ENV_NAMES)


def test_unknown_env_names_the_accepted_ones():
    with pytest.raises(ValueError, match="accepted names: .*multi_countdown.*matrix.*chain"):
        make_dataset("countdown", 2, 3)
    with pytest.raises(ValueError, match="unknown env"):
        get_env(["matrix"])


@pytest.mark.parametrize("n, size", [(0, 3), (-1, 3), (2, 0), (2, -5), (1.5, 3), (2, True), ("2", 3)])
def test_bad_horizon_or_size(n, size):
    with pytest.raises(ValueError, match="n \\(the task horizon\\)|size \\(the number of rows\\)"):
        make_dataset("matrix", n, size)


def test_chain_rejects_horizon_beyond_its_name_pool():
    with pytest.raises(ValueError, match="chain supports n <= 30"):
        make_dataset("chain", 31, 1)


# ---- generation contract --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORE)
def test_deterministic_and_seed_dependent(name):
    first = make_dataset(name, 3, 4, seed=7).to_list()
    assert first == make_dataset(name, 3, 4, seed=7).to_list()
    assert first != make_dataset(name, 3, 4, seed=8).to_list()


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("n", [1, 3, 8])
def test_rows_follow_the_column_contract_and_self_validate(name, n):
    env = get_env(name)
    for row in make_dataset(name, n, 6, seed=n).to_list():
        assert row["env"] == name and row["n"] == n
        assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
        assert row["reference"].splitlines()[-1] == f"\\boxed{{{row['answer']}}}"
        assert last_boxed(row["reference"]) == row["answer"]
        points = _num_points(row)
        assert points == (n + 1 if name == "multi_countdown" else n)
        assert row["answer"] in row["reasoning_points"][-1]
        assert env.verify(row, row["reference"])
        assert env.match_points(row, row["reference"]) == set(range(1, points + 1))
        # the rules alone already propagate from the goal to every point
        assert _rules_closure(row, {points}) == set(range(1, points + 1))
        assert not env.verify(row, "")
        assert env.match_points(row, "") == set()


@pytest.mark.parametrize("name", CORE)
def test_reference_prefixes_reach_points_monotonically(name):
    env = get_env(name)
    for row in make_dataset(name, 4, 3, seed=11).to_list():
        reference, previous = row["reference"], set()
        for end in range(len(reference) + 1):
            reached = env.match_points(row, reference[:end])
            assert previous <= reached, (reference[:end], previous, reached)
            previous = reached
            # only the complete final box verifies
            assert env.verify(row, reference[:end]) == (end == len(reference))
        assert previous == set(range(1, _num_points(row) + 1))


def test_graph_shapes():
    countdown = make_dataset("multi_countdown", 3, 1).to_list()[0]
    assert countdown["reasoning_graph"] == [{"if_all": [4], "makes_obsolete": [1, 2, 3]}]
    matrix = make_dataset("matrix", 3, 1).to_list()[0]
    assert matrix["reasoning_graph"] == [{"if_all": [2], "makes_obsolete": [1]},
                                         {"if_all": [3], "makes_obsolete": [1, 2]}]
    assert make_dataset("matrix", 1, 1).to_list()[0]["reasoning_graph"] == []


def test_chain_graph_matches_the_reference_arithmetic():
    """Each rule's premises are exactly the earlier derived values its reference line uses."""
    for row in make_dataset("chain", 6, 5, seed=3).to_list():
        task = json.loads(row["task"])
        lines = row["reference"].splitlines()[:-1]
        rules = {rule["if_all"][0]: rule["makes_obsolete"] for rule in row["reasoning_graph"]}
        for k, line in enumerate(lines, start=1):
            name, a, op, b, value = re.fullmatch(r"(\w+) = (\d+) ([-+*]) (\d+) = (\d+)", line).groups()
            assert name == task["points"][k - 1]
            assert int(value) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
            assert 1 <= int(value) <= 99
            for premise in rules.get(k, []):
                assert premise < k and str(task["values"][task["points"][premise - 1]]) in (a, b)


def test_countdown_problems_are_solvable_with_small_numbers():
    for row in make_dataset("multi_countdown", 5, 4, seed=5).to_list():
        for problem, line in zip(json.loads(row["task"])["problems"], row["reference"].splitlines()):
            assert len(problem["numbers"]) == 4 and all(1 <= x <= 9 for x in problem["numbers"])
            value, used = evaluate(line.split(":", 1)[1].split("=")[0])
            assert value == problem["target"] and sorted(used) == sorted(problem["numbers"])


# ---- hand-checked matchers ------------------------------------------------------------------------------------


def _countdown_row():
    problems = [{"numbers": [3, 5, 2, 6], "target": 24}, {"numbers": [8, 3, 2, 1], "target": 21},
                {"numbers": [1, 5, 5, 5], "target": 24}]
    return {"env": "multi_countdown", "answer": "24, 21, 24", "task": json.dumps({"problems": problems})}


COUNTDOWN_SOLUTION = "P1: (5-3)*2*6 = 24\nP2: 8*3-2-1 = 21\nP3: 5*(5-1/5) = 24\n\\boxed{24, 21, 24}"


@pytest.mark.parametrize("text, points", [
    (COUNTDOWN_SOLUTION, {1, 2, 3, 4}),  # 5*(5-1/5) needs exact rational arithmetic
    ("P3: 5*(5-1/5) = 24\nP1: (5-3)*2*6 = 24\nP2: 8×3-2-1 = 21\n\\boxed{24,21,24}", {1, 2, 3, 4}),
    ("P1: (5-3)*2*6 = 24\nP2: 8*3-2+1 = 21\nP3: 5*(5-1/5) = 24\n\\boxed{24, 21, 24}", {1, 3}),  # P2 is 23
    ("P1: (5-3)*2*6 = 24\nP2: 8*3-3 = 21\n", {1}),  # 3 used twice, 2 and 1 unused
    ("P1: (5-3)*2*6 = 25\n", set()),  # states the wrong target
    ("P1: 5+3+2+6 = 24\n", set()),  # evaluates to 16
    ("P1: 5+3+2+6 = 16\nP1: (5-3)*2*6 = 24\n", set()),  # the first well-formed P1 line is the answer
    ("P1: let me think\nP1: five = 24\nP1: (5-3)*2*6 = 24\n", {1}),  # unparseable lines are not answers
    ("P1: (5-3)*2*6 = 24\nP2: 8*3-2-1 = 21\nP3: 5*(5-1/5) = 24\n", {1, 2, 3}),  # no final box
    ("P1: (5-3)*2*6 = 24\nP2: 8*3-2-1 = 21\nP3: 5*(5-1/5) = 24", {1, 2}),  # P3's line is not finished
    ("P1: (5-3)*2*6 = 24\r\nP2: 8*3-2-1 = 21\r\n", {1, 2}),
    ("P1: (5-3)*2*6 = 24\nP2: 8*3-2-1 = 21\nP3: 5*(5-1/5) = 24\n\\boxed{21, 24, 24}", {1, 2, 3}),  # order
    ("\\boxed{24, 21, 24}", set()),  # the final answer alone does not solve anything
    ("P4: (5-3)*2*6 = 24\nP0: 1 = 1\n", set()),  # labels outside 1..n
    ("P1: (5-3)*2*6 = 24", set()),  # a prefix of `= 240`: unfinished lines never count
])
def test_countdown_hand_cases(text, points):
    env, row = MultiCountdownEnv(), _countdown_row()
    assert env.match_points(row, text) == points
    assert env.verify(row, text) == (4 in points)


def test_countdown_expression_parser():
    assert evaluate("5*(5-1/5)") == (Fraction(24), [5, 5, 1, 5])
    assert evaluate("8-(3-2)") == (Fraction(7), [8, 3, 2])
    assert evaluate("8-3-2") == (Fraction(3), [8, 3, 2])
    assert evaluate("12/(2*3)") == (Fraction(2), [12, 2, 3])
    for bad in ["", "1/0", "(1+2", "1+", "-1+2", "2**3", "__import__('os')", "1 2", "(" * 5000 + "1" + ")" * 5000]:
        assert evaluate(bad) is None, bad


def _matrix_row():
    # [[1,2],[3,4]] -> rotate 90 clockwise -> add 1 -> transpose
    matrices = [[[3, 1], [4, 2]], [[4, 2], [5, 3]], [[4, 5], [2, 3]]]
    return {"env": "matrix", "answer": "[[4,5],[2,3]]", "task": json.dumps({"matrices": matrices})}


@pytest.mark.parametrize("text, points", [
    ("M1: [[3,1],[4,2]]\nM2: [[4,2],[5,3]]\nM3: [[4,5],[2,3]]\n\\boxed{[[4,5],[2,3]]}", {1, 2, 3}),
    ("M1: [[3, 1], [4, 2]]\nM2: [[4,2],[5,3]]\n", {1, 2}),  # spaces are fine
    ("M1: [[3,1],[4,2]]\nM2: [[4,2],[5,3]]", {1}),  # M2's line is not finished
    ("M1: [[3,1],[4,2]]\nM2: [[4,2],[5,4]]\nM3: [[4,5],[2,3]]\n", {1, 3}),  # a wrong middle step
    ("\\boxed{[[4,5],[2,3]]}", {3}),  # the outcome alone reaches the goal (closure does the rest)
    ("M3: [[4,5],[2,3]]\n\\boxed{[[4,5],[2,4]]}", {3}),
    ("M1: 3 1 | 4 2\n", set()),  # not the [[..],[..]] format
    ("M1: [[9,9],[9,9]]\nM1: [[3,1],[4,2]]\n", set()),  # first well-formed M1 line counts
    ("M1: [[3,1],[4,2]] and more\n", set()),
    ("M1: [[3,1],[4,2]\n", set()),  # unclosed
    ("M2: [[3,1],[4,2]]\n", set()),  # right matrix, wrong step
])
def test_matrix_hand_cases(text, points):
    env, row = MatrixEnv(), _matrix_row()
    assert env.match_points(row, text) == points
    assert env.verify(row, text) == ("\\boxed{[[4,5],[2,3]]}" in text)


def test_matrix_operations_by_hand():
    m = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    found = dict(_operations(m, random.Random(0)))
    assert found["rotate 90 degrees clockwise"] == [[7, 4, 1], [8, 5, 2], [9, 6, 3]]
    assert found["rotate 180 degrees"] == [[9, 8, 7], [6, 5, 4], [3, 2, 1]]
    assert found["rotate 90 degrees counterclockwise"] == [[3, 6, 9], [2, 5, 8], [1, 4, 7]]
    assert found["transpose (row i becomes column i)"] == [[1, 4, 7], [2, 5, 8], [3, 6, 9]]
    assert found["mirror along the anti-diagonal (transpose, then rotate 180 degrees)"] == [
        [9, 6, 3], [8, 5, 2], [7, 4, 1]]
    assert found["reverse the order of the columns (left-right mirror)"] == [[3, 2, 1], [6, 5, 4], [9, 8, 7]]
    assert found["reverse the order of the rows (upside-down mirror)"] == [[7, 8, 9], [4, 5, 6], [1, 2, 3]]
    for description, result in found.items():
        if match := re.fullmatch(r"add (\d) to every entry", description):
            assert result == [[v + int(match.group(1)) for v in r] for r in m]
        elif match := re.fullmatch(r"multiply every entry by (\d)", description):
            assert result == [[v * int(match.group(1)) for v in r] for r in m]
        elif match := re.match(r"delete row (\d)", description):
            assert result == [r for i, r in enumerate(m, start=1) if i != int(match.group(1))]
        elif match := re.match(r"delete column (\d)", description):
            assert result == [[v for j, v in enumerate(r, start=1) if j != int(match.group(1))] for r in m]
    assert len(found) == 11
    # a 2x2 constant matrix: geometric ops are no-ops and removals would leave < 2 rows/columns
    assert {d.split()[0] for d, _ in _operations([[5, 5], [5, 5]], random.Random(0))} == {"add", "multiply"}
    assert _operations([[99, 99], [99, 99]], random.Random(0)) == []


def test_parse_matrix():
    assert parse_matrix(" [[1, -2],[3,4]] ") == [[1, -2], [3, 4]]
    assert parse_matrix("[[1,2],[3]]") == [[1, 2], [3]]
    for bad in [None, "", "[[1,2],[3,4]", "[1,2]", "[[1,,2]]", "[[]]", "[[1,2]][[3,4]]", "[[1.5]]"]:
        assert parse_matrix(bad) is None


def _chain_row():
    task = {"points": ["figs", "plums", "hats"], "values": {"figs": 7, "plums": 14, "hats": 21}}
    return {"env": "chain", "answer": "21", "task": json.dumps(task)}


@pytest.mark.parametrize("text, points", [
    ("figs = 4 + 3 = 7\nplums = 7 * 2 = 14\nhats = 7 + 14 = 21\n\\boxed{21}", {1, 2, 3}),
    ("Figs = 7\nplums = 14.\n", {1, 2}),
    ("figs = 4 + 3\nfigs = 7\n", {1}),  # a line without a value states nothing
    ("figs = 8\nfigs = 7\n", set()),  # the first statement counts
    ("plums = 7 * 2 = 15\nhats = 21\n", {3}),
    ("\\boxed{21}", {3}),
    ("\\boxed{21.0}", {3}),
    ("hats = 21\n\\boxed{20}", {3}),
    ("pears = 4\nthe figs = 7\nfigs: 7\n", set()),  # unknown names and other formats
    ("figs = 4 + 3 = 7\nplums = 7 * 2 = 14", {1}),  # plums' line is not finished (could go on to 140)
])
def test_chain_hand_cases(text, points):
    env, row = ChainEnv(), _chain_row()
    assert env.match_points(row, text) == points
    assert env.verify(row, text) == (text.endswith("\\boxed{21}") or text.endswith("\\boxed{21.0}"))


# ---- fuzzing: matchers never raise ----------------------------------------------------------------------------

_FUZZ_ROWS = {name: make_dataset(name, 3, 1, seed=2).to_list()[0] for name in CORE}
_NEAR_FORMAT = st.text(alphabet="PM012345679:+-*/()=[], \n\\boxed{}.figs×", max_size=200)


def _mutated_reference(name):
    reference = _FUZZ_ROWS[name]["reference"]
    return st.tuples(st.integers(0, len(reference)), st.integers(0, len(reference)), st.text(max_size=20)).map(
        lambda cut: reference[: cut[0]] + cut[2] + reference[cut[1]:])


@pytest.mark.parametrize("name", CORE)
@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_matchers_never_raise(name, data):
    text = data.draw(st.one_of(st.text(max_size=300), _NEAR_FORMAT, _mutated_reference(name)))
    env, row = get_env(name), _FUZZ_ROWS[name]
    reached = env.match_points(row, text)
    assert reached <= set(range(1, _num_points(row) + 1))
    assert isinstance(env.verify(row, text), bool)
    assert env.verify(row, text) <= (_num_points(row) in reached)  # the outcome implies the goal point


@pytest.mark.parametrize("name", CORE)
@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data())
def test_points_other_than_the_goal_grow_with_any_prefix(name, data):
    """Complete lines only count, so even garbage cannot lose a point it once had (only the last box can change)."""
    text = data.draw(st.one_of(_NEAR_FORMAT, _mutated_reference(name)))
    env, row = get_env(name), _FUZZ_ROWS[name]
    goal, previous = {_num_points(row)}, set()
    for end in range(0, len(text) + 1, max(1, len(text) // 25)):
        reached = env.match_points(row, text[:end])
        assert previous - goal <= reached
        previous = reached


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(alphabet="0123456789+-*/() ×÷", max_size=60))
def test_expression_parser_never_raises(expression):
    result = evaluate(expression)
    assert result is None or isinstance(result[0], Fraction)


def test_envs_never_import_rewards():
    """`rewards` dispatches to `envs/`, so `envs/` importing `rewards` (even lazily, in a function) is a cycle."""
    import ast
    import pathlib
    import subprocess
    import sys

    import ppm_trl.envs

    for path in sorted(pathlib.Path(ppm_trl.envs.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")] + [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any(name.split(".")[-1] == "rewards" for name in names), f"{path.name}:{node.lineno} imports rewards"
    # And at run time: every env generates, matches and verifies without `ppm_trl.rewards` being loaded.
    script = ("import sys\nfrom ppm_trl.envs import ENV_NAMES, get_env, make_dataset\n"
              "for name in ENV_NAMES:\n    row = make_dataset(name, 2, 1, seed=0)[0]\n"
              "    assert get_env(name).verify(row, row['reference'])\n"
              "print(sorted(m for m in sys.modules if m.startswith('ppm_trl.')))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "ppm_trl.rewards" not in result.stdout and "ppm_trl.envs.chain" in result.stdout
