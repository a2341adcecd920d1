"""Column mapping (`ppm_trl.columns`): gold answers from GSM8K / MATH cells, renamed columns, named errors."""

from __future__ import annotations

import pytest
from datasets import Dataset

from ppm_trl.columns import boxed_reference, check_required_columns, gold_answer, map_columns, required_columns


@pytest.mark.parametrize(
    "cell,gold",
    [
        ("She sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips.\n#### 72", "72"),
        ("Total: 1,000 + 200.\n#### 1,200", "1200"),  # GSM8K writes thousands separators in some answers
        ("Add them: $\\boxed{\\frac{1}{2}}$, not \\boxed{3}... so $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}"),
        ("  72 ", "72"),
        (72, "72"),  # a numeric cell
        ("The answer is \\boxed{", None),  # unclosed: no answer rather than a wrong one
        ("\\boxed{ }", None),
        ("   ", None),
    ],
)
def test_gold_answer(cell, gold):
    assert gold_answer(cell) == gold


def test_boxed_reference_turns_the_gsm8k_line_into_a_box():
    assert boxed_reference("Step.\n#### 1,200") == "Step.\n\\boxed{1200}"
    assert boxed_reference("So \\boxed{3}.") == "So \\boxed{3}."
    assert boxed_reference("no final line") == "no final line"


def test_gsm8k_question_answer_maps_to_prompt_answer_reference():
    data = Dataset.from_dict({"question": ["How many?", "And now?"],
                              "answer": ["24 + 48 = 72\n#### 72", "2 * 3 = 6\n#### 6"]})
    mapped, report = map_columns(data, problem_column="question", reference_column="answer")
    assert mapped["prompt"] == [[{"role": "user", "content": "How many?"}], [{"role": "user", "content": "And now?"}]]
    assert mapped["answer"] == ["72", "6"]  # the gold after ####, read before `answer` is overwritten
    assert mapped["reference"] == ["24 + 48 = 72\n\\boxed{72}", "2 * 3 = 6\n\\boxed{6}"]
    assert mapped["question"] == ["How many?", "And now?"]  # the user's columns stay
    assert report == ["references: 2 GSM8K `#### x` final lines read as `\\boxed{x}`",
                      "gold answers from column 'answer': 2 GSM8K-style (`#### x`), 0 from the last \\boxed{}, "
                      "0 as written"]


def test_math_solution_gives_answer_and_reference():
    data = Dataset.from_dict({"problem": ["1+2?"], "solution": ["$1+2=3$, so \\boxed{3}."]})
    mapped, _ = map_columns(data, problem_column="problem", answer_column="solution", reference_column="solution")
    assert mapped["answer"] == ["3"] and mapped["reference"] == ["$1+2=3$, so \\boxed{3}."]


def test_plain_answer_column_under_another_name():
    data = Dataset.from_dict({"prompt": ["p", "q"], "final": ["72", "6"], "answer": ["unrelated", "cells"]})
    mapped, report = map_columns(data, answer_column="final")
    assert mapped["answer"] == ["72", "6"] and report == []


def test_unreadable_gold_answer_names_the_row():
    data = Dataset.from_dict({"prompt": ["a", "b", "c"], "solution": ["\\boxed{1}", "no box here? \\boxed{", "x"]})
    with pytest.raises(ValueError, match=r"column 'solution' of data.jsonl: no gold answer in 1 of 3 rows \(first: row 1"):
        map_columns(data, answer_column="solution", source="data.jsonl")


def test_empty_problem_cell_is_named():
    data = Dataset.from_dict({"question": ["ok", ""], "answer": ["1", "2"]})
    with pytest.raises(ValueError, match=r"column 'question', row 1: expected a non-empty string"):
        map_columns(data, problem_column="question")


def test_required_columns_per_method_and_reward():
    class Args:
        progress_scorer = "judge"
        process_scorer = "programmatic"

    assert set(required_columns("grpo", ["accuracy", "format"], Args())) == {"prompt", "answer"}
    assert set(required_columns("ppm", ["accuracy"], Args())) == {"prompt", "answer", "reasoning_points"}
    assert set(required_columns("papo", ["env_outcome"], Args())) == {"prompt", "env", "reasoning_points"}
    assert set(required_columns("arg", ["accuracy", "format"], Args())) == {"prompt", "answer", "reference"}
    data = Dataset.from_dict({"prompt": ["p"], "answer": ["1"]})
    check_required_columns(data, {"prompt": "x", "answer": "y"})  # nothing missing: no error
    with pytest.raises(ValueError, match=r"'env' \(needed by the `env_outcome` reward\): the programmatic"):
        check_required_columns(data, required_columns("grpo", ["env_outcome"], Args()))


def test_trainer_column_errors_name_the_datasets_columns_not_trls_keys():
    from ppm_trl import PPMConfig, PPMGRPOTrainer
    from ppm_trl.rewards import accuracy_reward

    data = Dataset.from_dict({"prompt": ["p"], "reasoning_points": [["a", "b"]], "solution": ["\\boxed{1}"]})
    args = PPMConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, num_generations=4,
                     per_device_train_batch_size=4, progress_scorer="judge", judge_model="openai/x", judge_probe=False)
    with pytest.raises(ValueError) as error:  # raised before any model is looked at ("never-loaded" is no model)
        PPMGRPOTrainer(model="never-loaded", reward_funcs=accuracy_reward, args=args, train_dataset=data)
    message = str(error.value)
    assert "PPM with the `accuracy_reward` reward needs the `answer` column" in message
    assert "the dataset's columns are ['prompt', 'reasoning_points', 'solution']" in message
    assert "--answer_column" in message and "completion_ids" not in message


@pytest.mark.parametrize("solution,gold", [
    ("So 6 + 6 = 12.\n#### 1,234.", "1234"),  # trailing period and thousands separators dropped
    ("Add.\n#### 3, 4", "3, 4"),  # not a thousands number: kept as written
    ("Both: \\boxed{7}\n#### 8", "7"),  # the box wins, as in `ppm-trl prepare`
    ("Unclosed \\boxed{7\n#### 8", "8"),
    ("no marker at all", None),
])
def test_prepare_and_train_read_gold_answers_alike(solution, gold):
    from ppm_trl.columns import gsm8k_answer
    from ppm_trl.judge import final_answer_of

    prepared = final_answer_of(solution) or gsm8k_answer(solution)  # what `ppm-trl prepare` extracts
    assert prepared == gold
    assert gold_answer(solution) == (gold if gold is not None else "no marker at all")  # train: else as written
