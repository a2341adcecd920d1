"""Chat-shaped data (a `messages` column, the worked solution in the assistant turn) through `train`'s column
mapping and `prepare`: the prompt is the conversation up to its last user turn, the assistant's reply is the
reference and the source of the gold answer, and no reply is ever left in a prompt (issue #23 item 10)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest  # noqa: E402
from datasets import Dataset  # noqa: E402
from judge_server import JudgeServer  # noqa: E402

from ppm_trl import cli  # noqa: E402
from ppm_trl.columns import map_columns  # noqa: E402

SYSTEM = {"role": "system", "content": "Answer with \\boxed{}."}


def chat(question: str, solution: str | None, *history: dict) -> list[dict]:
    turns = [SYSTEM, *history, {"role": "user", "content": question}]
    return turns + ([{"role": "assistant", "content": solution}] if solution is not None else [])


ROWS = [
    {"messages": chat("What is 1 + 2?", "We add: 1 + 2 = 3, so \\boxed{3}.")},
    {"messages": chat("What is 48 / 2?", "Half of 48 is 24.\n#### 24")},  # a GSM8K-style reply
    {"messages": chat("And times 2?", "24 * 2 = 48, so \\boxed{48}.",  # an earlier exchange stays as context
                      {"role": "user", "content": "What is 48 / 2?"}, {"role": "assistant", "content": "24"})},
]


def _solutions_in(prompt: list[dict]) -> list[str]:
    text = json.dumps(prompt)
    return [s for s in ("1 + 2 = 3", "Half of 48", "24 * 2 = 48") if s in text]


def test_messages_column_gives_prompt_reference_and_answer():
    data = Dataset.from_list(ROWS)
    mapped, report = map_columns(data, problem_column="messages", answer_column="messages",
                                 reference_column="messages", source="chat.jsonl")
    assert [_solutions_in(p) for p in mapped["prompt"]] == [[], [], []]
    assert mapped["prompt"][0] == ROWS[0]["messages"][:2]  # the system turn and the question
    assert mapped["prompt"][2] == ROWS[2]["messages"][:4]  # earlier turns kept, the final reply cut
    assert mapped["reference"] == ["We add: 1 + 2 = 3, so \\boxed{3}.", "Half of 48 is 24.\n\\boxed{24}",
                                   "24 * 2 = 48, so \\boxed{48}."]
    assert mapped["answer"] == ["3", "24", "48"]
    assert "prompts from the chats in column 'messages': 3 of 3 end with a reply after the last user turn, " \
           "left out of the prompt" in report
    assert mapped["messages"] == data["messages"]  # the user's own column stays as it is


def test_a_prompt_column_of_chats_never_keeps_the_reply():
    data = Dataset.from_list([{"prompt": r["messages"], "answer": a} for r, a in zip(ROWS, ["3", "24", "48"])])
    mapped, report = map_columns(data, source="chat.jsonl")
    assert [_solutions_in(p) for p in mapped["prompt"]] == [[], [], []]
    assert any("3 of 3 end with a reply" in line for line in report)
    unchanged = Dataset.from_list([{"prompt": chat("1+1?", None), "answer": "2"}])
    assert map_columns(unchanged)[0]["prompt"] == unchanged["prompt"]  # nothing to cut: nothing reported
    assert map_columns(unchanged)[1] == []


@pytest.mark.parametrize("cell,flag,match", [
    (chat("1+1?", None), "reference_column", r"column 'messages', row 0: no assistant turn after the last user turn"),
    ([SYSTEM, {"role": "assistant", "content": "2"}], "problem_column",
     r"column 'messages', row 0: a chat without a user turn \(roles \['system', 'assistant'\]\)"),
    ({"role": "user", "content": "x" * 200}, "problem_column",
     r"column 'messages', row 0: expected a non-empty string or a chat .* got dict \{'role': 'user', .*\.\.\.$"),
])
def test_unusable_chat_cells_are_named(cell, flag, match):
    data = Dataset.from_list([{"messages": cell}])
    with pytest.raises(ValueError, match=match):
        map_columns(data, **{flag: "messages"})


def test_train_reads_a_chat_file_with_the_column_flags(tmp_path, capsys):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--method", "arg", "--dataset_name", str(data), "--problem_column", "messages",
                  "--reference_column", "messages", "--answer_column", "messages", "--model_name_or_path",
                  "./no/such/model", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "3 of 3 end with a reply after the last user turn" in err
    assert "model path './no/such/model' does not exist" in err  # past every column check


def test_missing_answer_column_suggests_the_messages_column(tmp_path, capsys):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    with pytest.raises(SystemExit):
        cli.main(["train", "--method", "grpo", "--dataset_name", str(data), "--problem_column", "messages",
                  "--output_dir", str(tmp_path / "out"), "--use_cpu", "true"])
    assert "perhaps `--answer_column messages`" in capsys.readouterr().err


def test_prepare_reads_the_assistant_turn_as_the_reference(tmp_path, monkeypatch, capsys):
    import datasets

    from ppm_trl.prepare import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    out = tmp_path / "prepared"
    with JudgeServer() as server:
        main(["--dataset", str(data), "--problem_column", "messages", "--reference_column", "messages",
              "--judge-model", "openai/scripted-judge", "--api-base", server.api_base, "--out", str(out),
              "--num-retries", "0", "--no-progress"])
        rubric_requests = [b["messages"][-1]["content"] for b in server.bodies if "Generate a rubric" in
                           b["messages"][0]["content"]]
    prepared = datasets.load_from_disk(str(out))
    assert [_solutions_in(p) for p in prepared["prompt"]] == [[], [], []]
    assert prepared["prompt"][2] == ROWS[2]["messages"][:4]
    assert prepared["answer"] == ["3", "24", "48"]
    assert prepared["reference"][1] == "Half of 48 is 24.\n\\boxed{24}"
    assert len(rubric_requests) == 3 and any("Half of 48 is 24." in r for r in rubric_requests)
    assert "GSM8K-style answers: 1/3 extracted" in capsys.readouterr().out


def test_prepare_answer_column_of_chats_reads_the_replys_final_answer(tmp_path, monkeypatch):
    import datasets

    from ppm_trl.prepare import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    rows = [{**row, "solution": row["messages"][-1]["content"]} for row in ROWS]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with JudgeServer() as server:
        main(["--dataset", str(data), "--problem-column", "messages", "--reference-column", "solution",
              "--answer-column", "messages", "--judge-model", "openai/scripted-judge", "--api-base",
              server.api_base, "--out", str(tmp_path / "prepared"), "--num-retries", "0", "--no-progress"])
    assert datasets.load_from_disk(str(tmp_path / "prepared"))["answer"] == ["3", "24", "48"]
