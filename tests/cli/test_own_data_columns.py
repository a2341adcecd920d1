"""Column mapping (`ppm_trl.columns`): gold answers from GSM8K / MATH cells, renamed columns, named errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from datasets import Dataset

from ppm_trl.columns import boxed_reference, check_required_columns, gold_answer, map_columns, required_run_columns


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


def test_the_gold_answer_counts_leave_out_rows_left_out_for_another_reason():
    """Issue 44: a row with an empty question and a valid `#### 4` made the report say "-1 as written"."""
    data = Dataset.from_dict({"question": ["How many?", "", "And now?"],
                              "answer": ["#### 72", "#### 4", "#### 6"]})
    mapped, report = map_columns(data, problem_column="question", reference_column="answer",
                                 invalid_rows="drop")
    assert mapped["answer"] == ["72", "6"]
    assert "gold answers from column 'answer': 2 GSM8K-style (`#### x`), 0 from the last \\boxed{}, 0 as written" \
        in report


def test_math_solution_gives_answer_and_reference():
    data = Dataset.from_dict({"problem": ["1+2?"], "solution": ["$1+2=3$, so \\boxed{3}."]})
    mapped, _ = map_columns(data, problem_column="problem", answer_column="solution", reference_column="solution")
    assert mapped["answer"] == ["3"] and mapped["reference"] == ["$1+2=3$, so \\boxed{3}."]


def test_plain_answer_column_under_another_name():
    data = Dataset.from_dict({"prompt": ["p", "q"], "final": ["72", "6"], "answer": ["unrelated", "cells"]})
    mapped, report = map_columns(data, answer_column="final")
    assert mapped["answer"] == ["72", "6"] and report == []


def test_unreadable_gold_answer_names_the_row():
    # A column of boxed solutions: "x" is a solution without its box, not the answer "x".
    data = Dataset.from_dict({"prompt": ["a", "b", "c"], "solution": ["\\boxed{1}", "no box here? \\boxed{", "x"]})
    with pytest.raises(ValueError, match=r"column 'solution' of data.jsonl: no gold answer in 2 of 3 rows \(first: row 1"):
        map_columns(data, answer_column="solution", source="data.jsonl")


def test_unusable_rows_are_left_out_and_listed_in_one_line():
    """`invalid_rows="drop"` (what `ppm-trl train` and `eval` use): a GSM8K file with a row without an answer, a
    solution without its `####` line and an empty question trains on the rest; one report line lists them."""
    data = Dataset.from_dict({"question": ["How many?", "No answer?", "No marker?", "", "Again?"],
                              "answer": ["24 + 48 = 72\n#### 72", None, "She sold some clips.", "1 + 1\n#### 2",
                                         "2 * 3 = 6\n#### 6"]})
    with pytest.raises(ValueError, match=r"column 'question', row 3: expected a non-empty string"):
        map_columns(data, problem_column="question", reference_column="answer")
    mapped, report = map_columns(data, problem_column="question", reference_column="answer", invalid_rows="drop")
    assert mapped["question"] == ["How many?", "Again?"] and mapped["answer"] == ["72", "6"]
    assert mapped["reference"] == ["24 + 48 = 72\n\\boxed{72}", "2 * 3 = 6\n\\boxed{6}"]
    assert report[-1].startswith("left out 3 of 5 rows that cannot be used (rows 1, 2, 3): ")
    assert "row 2: no gold answer" in report[-1]
    with pytest.raises(ValueError, match="no row of the dataset can be used"):
        map_columns(data.select([1, 2]), problem_column="question", reference_column="answer", invalid_rows="drop")


def test_a_gsm8k_solution_without_its_marker_has_no_gold_answer():
    """`train` and `prepare` agree: in a column of GSM8K solutions, a row without `####` has no gold answer (not
    its whole text), and a bare-answer column is read as written."""
    from ppm_trl.prepare import answer_of

    solutions = Dataset.from_dict({"prompt": ["p", "q", "r"], "answer": ["x\n#### 1", "y\n#### 2", "He sold some."]})
    with pytest.raises(ValueError, match=r"no gold answer in 1 of 3 rows \(first: row 2"):
        map_columns(solutions)
    args = SimpleNamespace(answer_column="answer", reference_column="answer")
    assert [answer_of(row, args, i, solution_column=True)[0] for i, row in enumerate(solutions)] == ["1", "2", None]
    bare = Dataset.from_dict({"prompt": ["p", "q"], "final": ["72", "He sold some."]})
    assert map_columns(bare, answer_column="final")[0]["answer"] == ["72", "He sold some."]


@pytest.mark.parametrize("cell,gold", [("So \\fbox{7}.", "7"), ("The answer is $\\boxed 4$.", "4"),
                                       ("So \\boxed 12.", "12")])
def test_the_other_box_spellings_are_read(cell, gold):
    from ppm_trl.judge import final_answer_of
    from ppm_trl.prepare import answer_of

    assert gold_answer(cell) == gold
    assert boxed_reference(cell).count("\\boxed{" + gold + "}") == 1
    assert answer_of({"solution": cell}, SimpleNamespace(answer_column=None, reference_column="solution"))[0] == gold
    assert final_answer_of(cell) is None  # the judge's reader is given normalised text by prepare


def test_empty_problem_cell_is_named():
    data = Dataset.from_dict({"question": ["ok", ""], "answer": ["1", "2"]})
    with pytest.raises(ValueError, match=r"column 'question', row 1: expected a non-empty string"):
        map_columns(data, problem_column="question")


def test_required_columns_per_method_and_reward():
    class Args:
        progress_scorer = "judge"
        process_scorer = "programmatic"

    assert set(required_run_columns("grpo", ["accuracy", "format"], Args())) == {"prompt", "answer"}
    assert set(required_run_columns("ppm", ["accuracy"], Args())) == {"prompt", "answer", "reasoning_points"}
    assert set(required_run_columns("papo", ["env_outcome"], Args())) == {"prompt", "env", "reasoning_points"}
    assert set(required_run_columns("arg", ["accuracy", "format"], Args())) == {"prompt", "answer", "reference"}
    data = Dataset.from_dict({"prompt": ["p"], "answer": ["1"]})
    check_required_columns(data, {"prompt": "x", "answer": "y"})  # nothing missing: no error
    with pytest.raises(ValueError, match=r"'env' \(needed by the `env_outcome` reward\): the programmatic"):
        check_required_columns(data, required_run_columns("grpo", ["env_outcome"], Args()))


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
    # Python users get the Python fix, not the command line's flag (issue 33 item 5)
    assert "map_columns(dataset, answer_column=COLUMN)" in message and "completion_ids" not in message
    assert "--answer_column" not in message


def test_python_column_errors_suggest_the_fix_that_works():
    """Missing points: PPM needs the `ppm-trl prepare` command (`map_columns` cannot make them); PAPO can instead
    score with the judge, which reads only `reference`. In Python spelling; the command line's in flags."""
    from ppm_trl import PAPOConfig, PAPOTrainer, PPMConfig, PPMGRPOTrainer
    from ppm_trl.columns import check_required_columns, required_run_columns
    from ppm_trl.rewards import accuracy_reward

    data = Dataset.from_dict({"prompt": ["p"], "answer": ["1"], "reference": ["\\boxed{1}"]})
    common = dict(output_dir="/tmp/unused", use_cpu=True, bf16=False, num_generations=4, per_device_train_batch_size=4)
    with pytest.raises(ValueError) as ppm:
        PPMGRPOTrainer(model="never-loaded", reward_funcs=accuracy_reward, train_dataset=data,
                       args=PPMConfig(**common, progress_scorer="judge", judge_model="openai/x", judge_probe=False))
    assert "run the `ppm-trl prepare` command on the dataset" in str(ppm.value)
    assert "map_columns" not in str(ppm.value)
    with pytest.raises(ValueError) as papo:
        PAPOTrainer(model="never-loaded", reward_funcs=accuracy_reward, train_dataset=data, args=PAPOConfig(**common))
    assert '`process_scorer="judge"` scores with the judge, which reads only `reference`' in str(papo.value)
    with pytest.raises(ValueError) as cli:
        check_required_columns(data, required_run_columns("papo", ["accuracy"], PAPOConfig(**common)))
    assert "`--process_scorer judge` scores with the judge" in str(cli.value)


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
    assert gold_answer(solution, solution=True) == gold  # train, in a column of worked solutions
