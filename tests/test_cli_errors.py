"""User errors in `ppm-trl train|eval` are one named line on stderr (exit 2), before any model is loaded; runtime
judge failures exit 1; `--debug` and genuine bugs keep their traceback (issue #16 item 7, #18 items 2 and 9)."""

from __future__ import annotations

import json

import pytest
import yaml

from ppm_trl import cli

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


def test_long_prompts_are_refused_before_training(tmp_path, capsys):
    rows = [{"prompt": "short", "answer": "1"}, {"prompt": "x " * 400, "answer": "2"},
            {"prompt": "y " * 300, "answer": "3"}]
    data = _jsonl(tmp_path / "long.jsonl", rows)
    config = _config(tmp_path, dataset_name=str(data), model_name_or_path="tiny", max_prompt_length=64)
    err = _fails(capsys, "train", "--config", str(config))
    assert "2 of 3 prompts are longer than 64 tokens (max_prompt_length=64); first: row 1 with" in err
    assert "long_prompts: drop" in err


def test_long_prompts_drop_keeps_the_rest():
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    datasets = pytest.importorskip("datasets")
    _, tokenizer = build_tiny_model_and_tokenizer(seed=0)
    dataset = datasets.Dataset.from_dict({"prompt": ["short", "x " * 400, "ok"], "answer": ["1", "2", "3"]})
    script = cli.TrainScriptArguments(max_prompt_length=64, long_prompts="drop")

    class Args:
        max_completion_length = 16

    class Config:
        max_position_embeddings = 100_000

    import transformers

    original = transformers.AutoConfig.from_pretrained
    transformers.AutoConfig.from_pretrained = lambda *a, **k: Config()
    try:
        kept = cli.check_prompt_lengths(dataset, tokenizer, "unused", script, Args())
    finally:
        transformers.AutoConfig.from_pretrained = original
    assert kept["answer"] == ["1", "3"]


def test_debug_shows_the_traceback(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    with pytest.raises(cli.UsageError, match="is empty"):
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
