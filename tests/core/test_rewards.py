"""Reward functions, called the way GRPOTrainer._calculate_rewards calls them."""

from __future__ import annotations

import threading

import pytest
from datasets import concatenate_datasets

from ppm_trl.envs import make_dataset
from ppm_trl.rewards import accuracy_reward, env_outcome_reward, env_point_fraction, format_reward
from ppm_trl.text import completion_text, last_boxed

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

def _conversational(texts):
    return [[{"role": "assistant", "content": text}] for text in texts]


def _trl_call(func, texts, dataset_rows):
    """Mimic GRPOTrainer: every column but `prompt` as a keyword list, plus trainer extras."""
    keys = [key for key in dataset_rows[0] if key not in ("prompt", "completion", "completion_ids")]
    kwargs = {key: [row[key] for row in dataset_rows] for key in keys}
    kwargs.update(trainer_state=None, log_extra=lambda *a: None, log_metric=lambda *a: None)
    prompts = [row.get("prompt", "") for row in dataset_rows]
    return func(prompts=prompts, completions=_conversational(texts), completion_ids=[[1]] * len(texts), **kwargs)


# ---- helpers ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{2} then \\boxed{3", None),  # an unclosed last box is no answer
    ("no box here", None),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not nesting
    ("\\boxed {7}", "7"),
    ("\\boxed{[[1,2],[3,4]]}", "[[1,2],[3,4]]"),
    ("\\boxed{}", ""),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_completion_text_forms():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "a"}]) == "a"
    multi_turn = [{"role": "assistant", "content": "a"}, {"role": "tool", "content": "tool output"},
                  {"role": "assistant", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}]}]
    assert completion_text(multi_turn) == "a\nbc"
    assert completion_text({"role": "assistant", "content": None}) == ""
    with pytest.raises(TypeError, match="completion must be a string or a list of messages"):
        completion_text(42)
    with pytest.raises(TypeError, match="list of message dicts"):
        completion_text(["not a message"])


# ---- accuracy / format -----------------------------------------------------------------------------------------


ACCURACY_CASES = [
    ("The answer is \\boxed{1/2}.", "0.5", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # nested braces
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.50}", "1/2", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("The answer is 0.5", "0.5", 0.0),  # no box
    ("\\boxed{0.5", "0.5", 0.0),  # unclosed box
    ("\\boxed{1/2} no wait \\boxed{3}", "0.5", 0.0),  # the last box is the answer
    ("\\boxed{42}", "42", 1.0),
    ("\\boxed{[[4,5],[2,3]]}", "[[4,5],[2,3]]", 1.0),  # exact match without parsing
    ("\\boxed{7}", "\\text{}", None),  # gold cannot be parsed
]


def test_accuracy_reward_cases():
    texts, golds, expected = zip(*ACCURACY_CASES)
    rows = [{"prompt": "q", "answer": gold} for gold in golds]
    assert _trl_call(accuracy_reward, texts, rows) == list(expected)


def test_accuracy_reward_plain_strings_and_missing_column():
    assert accuracy_reward(["\\boxed{2}", "\\boxed{3}"], answer=["2", "2"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="column 'answer'"):
        accuracy_reward(["\\boxed{2}"], solution=["2"])
    with pytest.raises(ValueError, match="1 entries for 2 completions"):
        accuracy_reward(["\\boxed{2}", "x"], answer=["2"])


def test_accuracy_reward_off_the_main_thread():
    """TRL awaits async reward functions on another thread, where math-verify's signal.alarm would raise."""
    results = []
    thread = threading.Thread(target=lambda: results.append(
        accuracy_reward(_conversational(["\\boxed{1/2}", "\\boxed{2}"]), answer=["0.5", "0.5"])))
    thread.start()
    thread.join(timeout=60)
    assert results == [[1.0, 0.0]]


def test_format_reward():
    texts = ["\\boxed{3}", "\\boxed{}", "\\boxed{3", "no answer", "\\boxed{\\frac{1}{2}} done"]
    assert format_reward(_conversational(texts)) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_reward_functions_have_loggable_names():
    for func in (accuracy_reward, format_reward, env_outcome_reward, env_point_fraction):
        assert func.__name__ == func.__qualname__ and func.__name__.endswith(("reward", "fraction"))


# ---- env rewards -----------------------------------------------------------------------------------------------


def test_env_rewards_dispatch_on_the_env_column():
    mixed = concatenate_datasets([make_dataset("matrix", 3, 2, seed=1), make_dataset("multi_countdown", 2, 2)])
    rows = mixed.to_list()
    matrix_row, countdown_row = rows[0], rows[2]
    texts = [
        matrix_row["reference"],  # full solution
        matrix_row["reference"].splitlines()[0] + "\n",  # only M1
        countdown_row["reference"],
        "garbage \\boxed{1}",
    ]
    batch = [matrix_row, matrix_row, countdown_row, countdown_row]
    assert _trl_call(env_outcome_reward, texts, batch) == [1.0, 0.0, 1.0, 0.0]
    assert _trl_call(env_point_fraction, texts, batch) == [1.0, 1 / 3, 1.0, 0.0]


def test_env_point_fraction_counts_points_before_closure():
    row = make_dataset("matrix", 4, 1, seed=3).to_list()[0]
    only_the_answer = "\\boxed{" + row["answer"] + "}"
    assert _trl_call(env_outcome_reward, [only_the_answer], [row]) == [1.0]
    assert _trl_call(env_point_fraction, [only_the_answer], [row]) == [0.25]


def test_env_rewards_bad_input():
    row = make_dataset("chain", 2, 1).to_list()[0]
    no_env = {key: value for key, value in row.items() if key != "env"}
    with pytest.raises(ValueError, match="column 'env'"):
        _trl_call(env_outcome_reward, ["x"], [no_env])
    with pytest.raises(ValueError, match="unknown env 'sudoku'"):
        _trl_call(env_outcome_reward, ["x"], [{**row, "env": "sudoku"}])
    with pytest.raises(ValueError, match="reasoning_points"):
        _trl_call(env_point_fraction, ["x"], [{**row, "reasoning_points": []}])
