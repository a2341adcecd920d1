"""Issue 33 items 1 and 5: `prepare` and `train` on realistic, messy data. Rows that can never be prepared are left
out and listed in one place while the rest is written; `train` on an unfinished prepare directory is one line that
names the fix; a judge budget stop has its own exit status; Ctrl-C before training is one line."""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import JudgeServer  # noqa: E402

from ppm_trl import cli  # noqa: E402
from ppm_trl.data import FAILURES_FILE, PROGRESS_FILE
from ppm_trl.flags import JUDGE_BUDGET_EXIT_CODE
from ppm_trl.prepare import main

GOOD = [{"question": f"She sold {n} clips and {n} more. How many?", "answer": f"{n} + {n} = {2 * n}.\n#### {2 * n}"}
        for n in range(1, 5)]
MESSY = [*GOOD,
         {"question": "A row without an answer?", "answer": None},
         {"question": "A solution without its final line?", "answer": "She sold some clips."},
         {"question": "", "answer": "1 + 1 = 2.\n#### 2"},
         GOOD[0], GOOD[1]]  # duplicates


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def prepare(data, server, out, *extra):
    return main(["--dataset", data, "--problem-column", "question", "--reference-column", "answer", "--judge-model",
                 "openai/scripted-judge", "--api-base", server.api_base, "--out", str(out), "--num-retries", "0",
                 "--no-progress", *extra])


def test_prepare_writes_the_rows_it_can_and_lists_the_others(tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    data = write_jsonl(tmp_path / "gsm8k.jsonl", MESSY)
    out = tmp_path / "prepared"
    with JudgeServer() as server:
        prepare(data, server, out)  # no exit: the rows that can be prepared are written
        asked = json.dumps(server.bodies)
    assert "She sold some clips." not in asked and "A row without an answer" not in asked  # no judge call spent
    prepared = datasets.load_from_disk(str(out))
    assert prepared["answer"] == ["2", "4", "6", "8", "2", "4"]  # the good rows and the duplicates
    failures = [json.loads(line) for line in (out / FAILURES_FILE).read_text().splitlines()]
    assert [(f["index"], f["kind"], f["retry"]) for f in failures] == [
        (4, "invalid_row", False), (5, "no_answer", False), (6, "invalid_row", False)]
    printed = capsys.readouterr().out
    assert ("leaving out 3 row(s) that can never be prepared as they are (1 without a final answer (no judge call), "
            "2 with an empty problem or reference") in printed
    assert "Rerun" not in printed and "rerun" not in printed  # a rerun cannot give a row an answer


def test_prepare_of_a_chat_without_a_reply_leaves_out_that_row(tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    chats = [{"messages": [{"role": "user", "content": f"What is {n}+1?"},
                           {"role": "assistant", "content": f"{n}+1={n + 1}, so \\boxed{{{n + 1}}}"}]} for n in range(3)]
    chats.insert(1, {"messages": [{"role": "user", "content": "No reply here?"}]})
    data = write_jsonl(tmp_path / "chat.jsonl", chats)
    with JudgeServer() as server:
        main(["--dataset", data, "--problem-column", "messages", "--reference-column", "messages", "--judge-model",
              "openai/scripted-judge", "--api-base", server.api_base, "--out", str(tmp_path / "out"), "--no-progress"])
    assert datasets.load_from_disk(str(tmp_path / "out"))["answer"] == ["1", "2", "3"]
    assert "leaving out 1 row(s) that can never be prepared" in capsys.readouterr().out


@pytest.mark.parametrize("failures", [[], [{"index": 3, "kind": "unreadable", "retry": True}]])
def test_train_on_an_unfinished_prepare_names_the_fix(tmp_path, capsys, failures):
    """The progress files of a prepare that did not write its dataset: one line, not datasets' CastError."""
    out = tmp_path / "data" / "gsm8k"
    out.mkdir(parents=True)
    (out / PROGRESS_FILE).write_text(json.dumps({"meta": {}}) + "\n" + json.dumps(
        {"index": 0, "reasoning_points": ["a"], "reasoning_graph": []}) + "\n")
    (out / FAILURES_FILE).write_text("".join(json.dumps(f) + "\n" for f in failures))
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--method", "ppm", "--dataset_name", str(out), "--model_name_or_path", "tiny",
                  "--use_cpu", "true", "--output_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err and err.count("error:") == 1
    assert f"{str(out)!r} holds an unfinished `ppm-trl prepare`" in err
    assert ("add --drop-invalid" in err) == bool(failures) and f"--out {out}" in err


def test_a_judge_budget_stop_exits_3(monkeypatch, tmp_path, capsys):
    """`train` that the judge budget stopped saves the model and prints its summary, then exits 3, not 0."""
    from types import SimpleNamespace

    stopped = SimpleNamespace(stopped="judge budget spent at step 1: the judge used 9 tokens, reaching its budget "
                                      "max_total_tokens=5 (judge_max_total_tokens)")
    trainer = SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True),
                              callback_handler=SimpleNamespace(callbacks=[stopped]))
    from ppm_trl import train

    monkeypatch.setattr(train, "parse_train_args", lambda argv: (SimpleNamespace(method="ppm"), None, None))
    monkeypatch.setattr(train, "run_training", lambda *args: (trainer, None))
    monkeypatch.setattr(train, "training_summary", lambda *args: {"output_dir": "/abs/out"})
    monkeypatch.setattr(train, "report_done", lambda *args: None)
    with pytest.raises(SystemExit) as exited:
        cli.main(["train"])
    assert exited.value.code == JUDGE_BUDGET_EXIT_CODE == 3
    assert cli.in_flag_spelling(stopped.stopped).endswith("(--judge_max_total_tokens)")


def test_ctrl_c_before_training_is_one_line_and_exits_130(monkeypatch, capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "train", interrupted)
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--method", "ppm"])
    err = capsys.readouterr().err
    assert exited.value.code == 130 and "Traceback" not in err
    assert err.strip() == "ppm-trl train: interrupted (Ctrl-C) before any step was trained; nothing was saved"


def test_cli_errors_suggest_flags():
    """The library's Python spelling of a fix, as the command line takes it."""
    message = ("ARG: column `reference`, row 3: no marker. Fix the row or set arg_skip_invalid_references=True to "
               "skip such rows (counted).")
    assert cli.in_flag_spelling(message, ["--method", "arg"]).endswith(
        "set --arg_skip_invalid_references true to skip such rows (counted).")
    assert cli.in_flag_spelling('use `progress_scorer="judge"`') == "use `--progress_scorer judge`"
    described = "a batch of per_device_train_batch_size=8 × 1 process"  # a description, not a suggestion
    assert cli.in_flag_spelling(described) == described
