"""User errors in `ppm-trl train|eval` are one named line on stderr (exit 2), before any model is loaded; runtime
judge failures exit 1; `--debug` and genuine bugs keep their traceback (issue #16 item 7, #18 items 2 and 9)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from ppm_trl import cli
from ppm_trl.flags import UsageError
from ppm_trl.report import nothing_learned, training_summary
from ppm_trl.train import (
    TrainScriptArguments,
    check_prompt_lengths,
    eval_command,
    fit_generation_batch,
    parse_train_args,
    report_done,
)

MISSING_MODEL = "./no/such/model"  # every error below must come before the model is looked at


def _config(tmp_path, name="config.yaml", **overrides):
    config = {"method": "grpo", "model_name_or_path": MISSING_MODEL, "output_dir": str(tmp_path / "out"),
              "use_cpu": True, "per_device_train_batch_size": 8, "num_generations": 8, "max_completion_length": 16,
              "max_steps": 1, "report_to": "none", **overrides}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _fails(capsys, *argv, code=2) -> str:
    with pytest.raises(SystemExit) as error:
        cli.main(list(argv))
    err = capsys.readouterr().err
    assert error.value.code == code, err
    assert "Traceback" not in err and err.count("error:") == 1
    return err


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


GSM8K = [{"question": f"Natalia sold {n} clips. How many?", "answer": f"She sold {n} clips.\n#### {n}"}
         for n in (48, 72, 1000)]


def test_empty_dataset_file(tmp_path, capsys):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n")
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data))))
    assert f"data file '{data}' is empty" in err


def test_non_utf8_jsonl_names_file_and_line(tmp_path, capsys):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data))))
    assert f"data file '{data}', line 2: not UTF-8 text" in err


def test_broken_jsonl_line_is_named(tmp_path, capsys):
    data = tmp_path / "broken.jsonl"
    data.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n')
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data))))
    assert f"data file '{data}', line 2: not valid JSON" in err


def test_non_utf8_yaml_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"method: ppm\noutput_dir: out\nrun_name: caf\xe9\n")
    err = _fails(capsys, "train", "--config", str(path))
    assert f"config file '{path}', line 3: not UTF-8 text" in err


def test_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("method: ppm\noutput_dir: out\nnum_segments: [1, 2\nlearning_rate: 1e-5\n")
    err = _fails(capsys, "train", "--config", str(path))
    assert f"config file '{path}', line 4, column 14: invalid YAML: expected ',' or ']', but got ':'" in err
    assert "while parsing a flow sequence started at line 3" in err


def test_list_for_an_integer_field(tmp_path, capsys):
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, method="ppm", num_segments=[1, 2])))
    assert "`num_segments` must be an integer, got [1, 2]" in err


@pytest.mark.parametrize("where", ["yaml", "flag"])
def test_zero_generations(tmp_path, capsys, where):
    if where == "yaml":
        err = _fails(capsys, "train", "--config", str(_config(tmp_path, num_generations=0)))
    else:
        err = _fails(capsys, "train", "--config", str(_config(tmp_path)), "--num_generations", "0")
    assert "num_generations must be >= 1" in err and "ZeroDivisionError" not in err


def test_missing_answer_column_lists_the_datasets_columns_and_the_fix(tmp_path, capsys):
    data = _jsonl(tmp_path / "math.jsonl", [{"problem": "1+1?", "solution": "2"}])
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data))))
    assert "lacks column(s) 'prompt', 'answer'; its columns are ['problem', 'solution']" in err
    assert "`--problem_column problem`" in err and "`--answer_column solution`" in err
    assert "ppm-trl prepare" in err
    assert "completion_ids" not in err and MISSING_MODEL not in err  # no TRL keys; the model was never looked at


@pytest.mark.parametrize(
    "method,extra,missing",
    [("arg", {}, "'reference' (needed by ARG"),
     ("papo", {"process_scorer": "judge"}, "'reference' (needed by PAPO's judge process scorer"),
     ("ppm", {"progress_scorer": "judge"}, "'reasoning_points' (needed by PPM)"),
     ("ppm", {"progress_scorer": "programmatic"}, "'env' (needed by PPM's programmatic progress scorer")],
)
def test_each_methods_columns_are_checked_before_the_model(tmp_path, capsys, method, extra, missing):
    data = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, method=method, dataset_name=str(data), **extra)),
                 "--problem_column", "question")
    assert missing in err and MISSING_MODEL not in err


def test_wrong_column_flag_is_named(tmp_path, capsys):
    data = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data))),
                 "--problem_column", "questions")
    assert f"--problem_column 'questions' is not a column of {data}; its columns are ['question', 'answer']" in err


def test_gsm8k_file_passes_the_column_checks_with_one_flag(tmp_path, capsys):
    data = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, method="arg", dataset_name=str(data))),
                 "--problem_column", "question", "--reference_column", "answer")
    # Past the column checks: the next thing looked at is the (missing) model.
    assert "gold answers from column 'answer': 3 GSM8K-style" in err
    assert "model path './no/such/model' does not exist" in err


def test_long_prompts_are_refused_before_training_with_long_prompts_error(tmp_path, capsys):
    rows = [{"prompt": "short", "answer": "1"}, {"prompt": "x " * 400, "answer": "2"},
            {"prompt": "y " * 300, "answer": "3"}]
    data = _jsonl(tmp_path / "long.jsonl", rows)
    config = _config(tmp_path, dataset_name=str(data), model_name_or_path="tiny", max_prompt_length=64)
    err = _fails(capsys, "train", "--config", str(config), "--long_prompts", "error")
    assert "2 of 3 prompts are longer than 64 tokens (max_prompt_length=64); first: row 1 with" in err
    assert "pass --long_prompts drop" in err  # the flag, on the command line


def test_long_prompts_are_left_out_by_default_and_named(capsys):
    """Issue 33 item 1: a very long row is left out and named (as `prepare` leaves out rows it cannot use), not a
    stop that asks for `--long_prompts drop`."""
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    datasets = pytest.importorskip("datasets")
    _, tokenizer = build_tiny_model_and_tokenizer(seed=0)
    dataset = datasets.Dataset.from_dict({"prompt": ["short", "x " * 400, "ok"], "answer": ["1", "2", "3"]})
    script = TrainScriptArguments(max_prompt_length=64)

    class Args:
        max_completion_length = 16

    class Config:
        max_position_embeddings = 100_000

    import transformers

    original = transformers.AutoConfig.from_pretrained
    transformers.AutoConfig.from_pretrained = lambda *a, **k: Config()
    try:
        kept = check_prompt_lengths(dataset, tokenizer, "unused", script, Args())
    finally:
        transformers.AutoConfig.from_pretrained = original
    assert kept["answer"] == ["1", "3"]
    assert ("ppm-trl train: leaving out the prompts that do not fit: 1 of 3 prompts are longer than 64 tokens "
            "(max_prompt_length=64); first: row 1") in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    with pytest.raises(UsageError, match="is empty"):
        cli.main(["train", "--config", str(_config(tmp_path, dataset_name=str(data))), "--debug"])


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    def bug(argv):
        raise KeyError("a genuine bug")

    monkeypatch.setattr(cli, "train", bug)
    with pytest.raises(KeyError, match="a genuine bug"):
        cli.main(["train"])


def test_a_judge_that_cannot_judge_exits_1(monkeypatch, capsys):
    from ppm_trl.judge import JudgeConfigurationError

    def unreachable(argv):
        raise JudgeConfigurationError("judge openai/x at http://127.0.0.1:9: connection refused")

    monkeypatch.setattr(cli, "train", unreachable)
    err = _fails(capsys, "train", code=1)
    assert "ppm-trl train: error: judge openai/x at http://127.0.0.1:9: connection refused" in err


def test_prepare_wrong_column_is_one_line(tmp_path, capsys):
    data = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    err = _fails(capsys, "prepare", "--dataset", str(data), "--problem-column", "questions", "--reference-column",
                 "answer", "--judge-model", "hosted_vllm/x", "--api-base", "http://127.0.0.1:9/v1",
                 "--out", str(tmp_path / "prepared"))
    assert "ppm-trl prepare: error: --problem-column 'questions' is not a column of" in err


def test_train_against_an_unreachable_judge_fails_fast_with_exit_1(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HOSTED_VLLM_API_KEY", raising=False)
    rows = [{"prompt": "1+1?", "answer": "2", "reasoning_points": ["one plus one", "\\boxed{2}"]}] * 4
    data = _jsonl(tmp_path / "prepared.jsonl", rows)
    config = _config(tmp_path, method="ppm", dataset_name=str(data), model_name_or_path="tiny",
                     progress_scorer="judge", judge_model="hosted_vllm/x", judge_api_base="http://127.0.0.1:9/v1",
                     judge_num_retries=0)
    err = _fails(capsys, "train", "--config", str(config), code=1)
    assert "judge model 'hosted_vllm/x' at api_base=http://127.0.0.1:9/v1 cannot be used" in err
    assert not (tmp_path / "out" / "model.safetensors").exists()  # nothing trained


# ------------------------------------------------------------------ issue #23: data and model a user types in
@pytest.mark.parametrize("name,expected", [
    ("nosuch.jsonl", "dataset 'nosuch.jsonl' does not exist (no such file or directory in"),
    ("./data/nosuch", "dataset './data/nosuch' does not exist"),
    ("data/prepared/gsm8k", "dataset 'data/prepared/gsm8k' does not exist"),
    ("someone/nosuch-dataset", "dataset 'someone/nosuch-dataset' is not a local file or directory, and the Hub "
                               "could not provide it"),
])
def test_a_dataset_that_does_not_exist_is_one_line(tmp_path, capsys, monkeypatch, name, expected):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=name)))
    assert expected in err and MISSING_MODEL not in err
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    err = _fails(capsys, "eval", "--model", str(tmp_path / "model"), "--dataset_name", name)
    assert expected in err


@pytest.mark.parametrize("model,expected", [
    ("outputs/nosuch", "--model 'outputs/nosuch' is not a local directory (none in"),
    ("./outputs/nosuch", "--model './outputs/nosuch' does not exist (no such directory in"),
    ("someone/nosuch-model", "the Hub could not provide it"),
])
def test_eval_of_a_model_that_does_not_exist_is_one_line(tmp_path, capsys, monkeypatch, model, expected):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    err = _fails(capsys, "eval", "--model", model, "--env", "multi_add")
    assert expected in err
    if "Hub" in expected:
        assert "HF_HUB_OFFLINE is set" in err


def test_eval_of_a_directory_without_a_model_names_its_checkpoints(tmp_path, capsys):
    (tmp_path / "run" / "checkpoint-100").mkdir(parents=True)
    err = _fails(capsys, "eval", "--model", str(tmp_path / "run"), "--env", "multi_add")
    assert "is a directory without a saved model (no config.json); its checkpoints: checkpoint-100" in err


def test_train_with_a_hub_model_id_that_cannot_be_had_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1?", "answer": "2"}])
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data),
                                                          model_name_or_path="outputs/nosuch")))
    assert "--model_name_or_path 'outputs/nosuch' is not a local directory" in err


def _prepare(tmp_path, data, *extra):
    return ("prepare", "--dataset", str(data), "--reference-column", "answer", "--judge-model", "hosted_vllm/x",
            "--api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "prepared"), *extra)


@pytest.mark.parametrize("content,expected", [
    (b"", "data file '{}' is empty"),
    (b"\n\n", "data file '{}' is empty"),
    (b'{"question": "q", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n',
     "data file '{}', line 2: not UTF-8 text"),
    (b'{"question": "q", "answer": "#### 1"}\n{"question": \n', "data file '{}', line 2: not valid JSON"),
])
def test_prepare_names_a_bad_data_file(tmp_path, capsys, content, expected):
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    err = _fails(capsys, *_prepare(tmp_path, data))
    assert expected.format(data) in err


def test_prepare_of_a_missing_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    err = _fails(capsys, *_prepare(tmp_path, "gsm8k_typo.jsonl"))
    assert "dataset 'gsm8k_typo.jsonl' does not exist" in err


def test_prepare_says_which_split_it_read(tmp_path, capsys):
    import argparse

    import datasets

    from ppm_trl.prepare import load_rows

    path = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"q": ["a", "b"]}),
                          "test": datasets.Dataset.from_dict({"q": ["c"]})}).save_to_disk(str(path))
    rows = load_rows(argparse.Namespace(dataset=str(path), split="test", config_name=None, limit=None))
    assert rows["q"] == ["c"]
    assert f"prepare: split 'test' of {path} (its splits: train, test; choose with --split)" in capsys.readouterr().out


# ---------------------------------------------------------------------------- flag typos, before validation
@pytest.mark.parametrize("argv,expected", [
    (["eval", "--modle", "x", "--env", "multi_add"], "unknown flag --modle; did you mean --model?"),
    (["eval", "--model", "x", "--num_smaples", "4"], "unknown flag --num_smaples; did you mean --num_samples?"),
    (["eval", "--model", "x", "--num_sample", "1", "--env", "multi_add"], "--k 8: pass@k needs"),  # a prefix: accepted
    (["train", "--method", "ppm", "--num_segmnets", "2"], "unknown flag --num_segmnets; did you mean --num_segments?"),
    (["train", "--lerning_rate=1e-5"], "unknown flag --lerning_rate; did you mean --learning_rate?"),
    # reported before the configs validate the (invalid) values around it
    (["train", "--num_generations", "0", "--output_dri", "x"], "unknown flag --output_dri; did you mean --output_dir?"),
    (["eval", "--k", "9", "--num_samples", "2", "--modell", "x"], "did you mean --model?"),
    (["train", "--xyzzy", "1"], "unknown flag --xyzzy; `ppm-trl train --help` lists the flags"),
    (["train", "--split", "test"], "unknown flag --split: `ppm-trl train` spells it --dataset_train_split"),
    (["eval", "--model", "x", "--dataset_train_split", "test"], "`ppm-trl eval` spells it --split"),
    (["eval", "--model_name_or_path", "x"], "`ppm-trl eval` spells it --model"),
])
def test_mistyped_flags_are_named_with_a_suggestion(capsys, argv, expected):
    assert expected in _fails(capsys, *argv)


def test_mistyped_yaml_key_is_named_with_a_suggestion(tmp_path, capsys):
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, num_generatoins=4, num_generations=0)))
    assert f"config file '{tmp_path / 'config.yaml'}': unknown key `num_generatoins`; did you mean " \
           "`num_generations`" in err
    path = tmp_path / "eval.yaml"
    path.write_text("modle: x\nenv_name: multi_add\n")
    assert "unknown key `modle`; did you mean `model`?" in _fails(capsys, "eval", "--config", str(path))


@pytest.mark.parametrize("argv,expected", [
    (["--refrence-column", "answer"], "unknown flag --refrence-column; did you mean --reference-column?"),
    (["--dataset_name", "x"], "unknown flag --dataset-name: `ppm-trl prepare` spells it --dataset"),
    (["--dataset_train_split", "x"], "`ppm-trl prepare` spells it --split"),
])
def test_prepare_flag_typos(tmp_path, capsys, argv, expected):
    data = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    assert expected in _fails(capsys, *_prepare(tmp_path, data, *argv))


def test_prepare_reads_trains_underscore_spellings(tmp_path, capsys):
    data = _jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    err = _fails(capsys, "prepare", "--dataset", str(data), "--problem_column", "questions", "--reference_column",
                 "answer", "--judge_model", "hosted_vllm/x", "--out", str(tmp_path / "p"))
    assert "--problem-column 'questions' is not a column of" in err  # parsed: the column is what is wrong


# ------------------------------------------------------------------------- the generation batch (item 8)
def test_ppm_defaults_train_with_a_fitted_batch(tmp_path, capsys):
    _, args, _ = parse_train_args(["--method", "ppm", "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert (args.num_generations, args.per_device_train_batch_size) == (16, 8)  # PPM's and TRL's defaults
    assert args.gradient_accumulation_steps == 2 and args.generation_batch_size == 16
    assert "so gradient_accumulation_steps=2: each optimizer step trains on 16 completions (1 prompt(s) × 16)" \
        in capsys.readouterr().err
    _, args, _ = parse_train_args(["--method", "ppm", "--output_dir", str(tmp_path), "--use_cpu", "true",
                                       "--per_device_train_batch_size", "6"])
    assert args.gradient_accumulation_steps == 8 and args.generation_batch_size == 48  # 3 prompts × 16
    capsys.readouterr()
    _, args, _ = parse_train_args(["--method", "grpo", "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert args.gradient_accumulation_steps == 1  # what fits is left alone
    assert "gradient_accumulation_steps" not in capsys.readouterr().err


@pytest.mark.parametrize("extra,fix", [
    (["--gradient_accumulation_steps", "1"], "gradient_accumulation_steps=1 = 8) must be a multiple of "
                                             "num_generations=16, so that each prompt's 16 completions are scored "
                                             "together; set --gradient_accumulation_steps 2, or "
                                             "--per_device_train_batch_size 16, or a --num_generations that divides 8"),
    (["--generation_batch_size", "24"], "(generation_batch_size = 24) must be a multiple of num_generations=16"),
    (["--generation_batch_size", "24"], "set --generation_batch_size 16"),
    (["--steps_per_generation", "3"], "set --steps_per_generation 2"),
])
def test_a_batch_the_user_set_that_cannot_fit_names_the_flags(tmp_path, capsys, extra, fix):
    err = _fails(capsys, "train", "--method", "ppm", "--output_dir", str(tmp_path), "--use_cpu", "true", *extra)
    assert fix in err and "generation_batch_size (8) must be divisible" not in err


def test_fit_generation_batch_counts_the_processes():
    defaults = {"num_generations": 16, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}
    from ppm_trl.configs import BATCH_KEYS

    unset = dict.fromkeys(BATCH_KEYS)
    assert fit_generation_batch(unset, defaults, num_processes=2) == ({}, None)  # 8 × 2 = 16
    assert fit_generation_batch({**unset, "num_generations": "12"}, defaults, num_processes=3) == ({}, None)
    derived, note = fit_generation_batch({**unset, "num_generations": "12"}, defaults, num_processes=1)
    assert derived == {"gradient_accumulation_steps": 3} and "8 × 1 process," in note  # 24 = 2 prompts × 12


# ----------------------------------------------------------------------------------------- the done line
class _Args:
    output_dir = "outputs/run"
    mask_truncated_completions = True
    max_completion_length = 64


@pytest.mark.parametrize("history,reason", [
    ([{"completions/clipped_ratio": 1.0, "grad_norm": 0.0}] * 2,
     "every completion reached max_completion_length=64 and was masked out of the loss"),
    ([{"ppm/frac_rows_filtered": 1.0, "grad_norm": 0.0}], "every group had zero advantage"),
    ([{"grad_norm": 0.0, "frac_reward_zero_std": 1.0}], "every logged grad_norm is 0; every prompt's completions"),
    ([{"grad_norm": 0.0}, {"grad_norm": 0.3}], None),
    ([{"completions/clipped_ratio": 1.0}, {"completions/clipped_ratio": 0.5}], None),
    ([], None),
])
def test_nothing_learned_names_why(history, reason):
    found = nothing_learned(history, _Args())
    assert (found is None) if reason is None else (reason in found)


def test_done_line_is_absolute_points_to_eval_and_warns(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)

    class Trainer:
        args = _Args()

        class state:  # noqa: N801
            log_history = [{"completions/clipped_ratio": 1.0, "ppm/final_progress": 0.5, "step_time": 1.0}]

    class Result:
        global_step, training_loss, metrics = 2, 0.0, {"train_runtime": 3.0}

    summary = training_summary(Trainer(), Result(), "ppm")
    assert summary["output_dir"] == str(tmp_path / "outputs" / "run")
    assert summary["metrics_mean"] == {"ppm/final_progress": 0.5} and summary["step_time_s"] == [1.0]
    script = TrainScriptArguments(method="ppm", dataset_name="data/gsm8k", problem_column="question")
    report_done("ppm-trl train", summary, Trainer(), script)
    out, err = capsys.readouterr()
    assert json.loads(out.split("ppm-trl train: done ", 1)[1]) == summary
    assert "ppm-trl train: warning: nothing was learned: every completion reached max_completion_length=64" in err
    assert (f"ppm-trl train: evaluate with: ppm-trl eval --model {tmp_path / 'outputs' / 'run'} --dataset_name "
            "HELD_OUT_DATA --problem_column question") in err
    env = TrainScriptArguments(env_name="multi_add", env_n=3)
    assert "--env multi_add --env_n 3" in eval_command("/x", env)


def test_litellm_reads_its_local_price_map_when_offline():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    code = ("import os; from ppm_trl.judge.transport import import_litellm; import_litellm(); "
            "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])")
    result = subprocess.run([sys.executable, "-c", code], env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                            text=True, timeout=300)
    assert result.stdout.strip() == "True", result.stderr[-2000:]
    assert "Failed to fetch remote model cost map" not in result.stderr


@pytest.mark.parametrize("name,content", [("rows.jsonl", "{}\n{}\n"), ("rows.json", "[]")])
def test_eval_of_a_data_file_without_rows_names_the_file(tmp_path, capsys, name, content):
    """datasets says only 'Instruction "train" corresponds to no data!' (issue 34 item 5)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # enough for the model check, which comes first
    data = tmp_path / name
    data.write_text(content)
    err = _fails(capsys, "eval", "--model", str(model), "--dataset_name", str(data))
    assert f"data file '{data}' holds no rows with columns" in err


def _prepared_dataset(path, **extra):
    import datasets

    rows = {"prompt": [[{"role": "user", "content": "What is 2 + 3?"}]], "answer": ["5"],
            "reference": ["2 + 3 = 5, so \\boxed{5}."], "reasoning_points": [["adds 2 and 3"]],
            "reasoning_graph": [[{"if_all": [], "makes_obsolete": []}]], **extra}
    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    return path


def test_a_column_flag_on_prepared_data_names_the_users_column(tmp_path, capsys):
    """`answer` of a prepared dataset holds the gold answers: as `--reference_column` it was copied to `reference`,
    and ARG's check then blamed column `reference`, which the user never named (issue 34 item 5)."""
    data = _prepared_dataset(tmp_path / "prepared", original_answer=["2 + 3 = 5.\n#### 5"])
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data))),
                 "--reference_column", "answer")
    assert ("error: --reference_column 'answer': " + str(data) + " was written by `ppm-trl prepare`, so its column "
            "'answer' holds the gold final answers, and the worked solutions are in 'reference', read without a flag: "
            "drop --reference_column (your input's own 'answer' column is kept as 'original_answer': name that)") in err


def test_column_flags_that_fit_prepared_data_still_work(tmp_path):
    from ppm_trl.columns import map_columns

    data = _prepared_dataset(tmp_path / "prepared", original_answer=["2 + 3 = 5.\n#### 5"])
    import datasets

    dataset = datasets.load_from_disk(str(data))
    mapped, _ = map_columns(dataset, answer_column="reference", reference_column="original_answer")
    assert mapped["answer"] == ["5"] and mapped["reference"] == ["2 + 3 = 5.\n\\boxed{5}"]
    with pytest.raises(ValueError, match=r"^--problem_column 'reference': .* holds the worked solutions"):
        map_columns(dataset, problem_column="reference")


@pytest.mark.parametrize("variable", ["HF_ENDPOINT", "HF_TOKEN", "OPENAI_API_KEY", "OPENAI_API_BASE", "HTTPS_PROXY",
                                      "https_proxy", "REQUESTS_CA_BUNDLE", "LD_PRELOAD", "PYTHONPATH", "WANDB_BASE_URL"])
def test_a_config_env_block_cannot_redirect_requests_or_set_credentials(tmp_path, capsys, monkeypatch, variable):
    """Issue 41: a shared YAML's `env:` could set HF_ENDPOINT (every Hub request, with the user's token, elsewhere)."""
    monkeypatch.delenv(variable, raising=False)
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, env={variable: "http://attacker.example"})))
    assert f"`env` may not set {variable}" in err and variable not in os.environ


def test_a_config_env_block_may_set_ordinary_variables(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, env={"TOKENIZERS_PARALLELISM": "false"})))
    assert "`env`" not in err  # it fails later, on the missing model, not on the env block


def test_prepare_on_a_math_shaped_file_suggests_its_problem_column(tmp_path, capsys):
    """Issue 44: the README's `prepare ... --reference-column solution` on a MATH-shaped file failed without saying
    which column holds the problem (the default is `prompt`)."""
    data = _jsonl(tmp_path / "math.jsonl", [{"problem": "What is 1 + 1?", "solution": "So \\boxed{2}."}])
    err = _fails(capsys, "prepare", "--dataset", str(data), "--reference-column", "solution", "--judge-model",
                 "openai/x", "--out", str(tmp_path / "out"))
    assert "--problem-column 'prompt' is not a column" in err and "did you mean --problem-column problem?" in err


@pytest.mark.parametrize("rank", ["0", "1"])
def test_what_every_process_reads_alike_is_reported_by_one(tmp_path, capsys, monkeypatch, rank):
    """Issue 44: under DDP the column report and the "leaving out prompts" line came once per rank."""
    monkeypatch.setenv("RANK", rank)
    data = _jsonl(tmp_path / "data.jsonl", [*GSM8K, {"question": "", "answer": "#### 4"}])
    err = _fails(capsys, "train", "--config", str(_config(tmp_path, dataset_name=str(data), problem_column="question",
                                                          reference_column="answer")))
    assert ("left out 1 of 4 rows" in err) == (rank == "0")


def test_the_prompt_length_check_says_it_once_in_its_own_words(tmp_path, capsys):
    """Issue 44: transformers' "Token indices sequence length" warning came before the project's own line."""
    from types import SimpleNamespace

    from datasets import Dataset

    from ppm_trl.tiny import build_tiny_model_and_tokenizer
    from ppm_trl.train import check_prompt_lengths

    model, tokenizer = build_tiny_model_and_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tokenizer.model_max_length = 8  # what makes the tokenizer warn
    data = Dataset.from_dict({"prompt": ["short", "x " * 100]})
    kept = check_prompt_lengths(data, tokenizer, str(tmp_path / "m"),
                                SimpleNamespace(max_prompt_length=32, long_prompts="drop"),
                                SimpleNamespace(max_completion_length=16))
    err = capsys.readouterr().err
    assert len(kept) == 1 and "leaving out the prompts that do not fit: 1 of 2 prompts" in err
    assert "Token indices sequence length" not in err
