"""`ppm-trl prepare` against the loopback judge: columns, validation, resume after an interruption."""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import GARBAGE_TEXT, JudgeServer, scripted_judge  # noqa: E402

from ppm_trl.prepare import FAILURES_FILE, PROGRESS_FILE, main, problem_of  # noqa: E402

ROWS = {
    "prompt": [  # conversational prompts: the problem is the last user message
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
        for question in ("What is 2 + 3?", "What is 4 * 2?", "What is 9 - 4?")
    ],
    "solution": [
        "Let x = 2.\nThen y = x + 3.\nSo \\boxed{5}.",
        "Multiply 4 by 2.\nThe product is \\boxed{8}.",
        "Subtract 4 from 9.\nSo the answer is \\boxed{5}.",
    ],
    "answer": ["5", "8", "6"],  # row 2's gold answer disagrees with its reference: its rubric cannot be validated
}


@pytest.fixture
def dataset_dir(tmp_path):
    import datasets

    path = tmp_path / "data"
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(path))
    return path


def arguments(dataset_dir, server, out, *extra: str) -> list[str]:
    return ["--dataset", str(dataset_dir), "--reference-column", "solution", "--judge-model", "openai/scripted-judge",
            "--api-base", server.api_base, "--out", str(out), "--num-retries", "0", "--timeout", "10",
            "--max-concurrency", "4", "--no-progress", *extra]


def flaky_on(problem: str):
    """A judge that answers garbage to the rubric request of one problem (a row that fails this run)."""

    def respond(body: dict) -> str:
        user = body["messages"][-1]["content"]
        if "Generate a rubric" in body["messages"][0]["content"] and problem in user:
            return GARBAGE_TEXT
        return scripted_judge(body)

    return respond


def test_prepare_resumes_and_validates(dataset_dir, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    out = tmp_path / "prepared"
    with JudgeServer(responder=flaky_on("4 * 2")) as server:
        with pytest.raises(RuntimeError, match=r"2 row\(s\) could not be prepared \(row 1: no readable <rubric>"):
            main(arguments(dataset_dir, server, out))
        first_requests = server.requests
    assert first_requests == 4  # rows 0 and 2 rubric, row 0 graph; row 1 rubric (garbage)
    progress = [json.loads(line) for line in (out / PROGRESS_FILE).read_text().splitlines()]
    assert [record.get("index") for record in progress] == [None, 0]  # the settings line, then row 0
    failures = [json.loads(line) for line in (out / FAILURES_FILE).read_text().splitlines()]
    assert [f["index"] for f in failures] == [1, 2] and "'6'" in failures[1]["reason"]

    # The rerun (fresh cache: resume must not rely on it) only asks for the rows that are not done yet.
    with JudgeServer() as server:
        main(arguments(dataset_dir, server, out, "--cache-dir", str(tmp_path / "fresh_cache"), "--drop-invalid"))
        assert server.requests == 3  # row 1 rubric + graph, row 2 rubric (still invalid)
    prepared = datasets.load_from_disk(str(out))
    assert prepared["answer"] == ["5", "8"]  # row 2 dropped, as listed in the failures file
    assert prepared[0]["reasoning_points"] == ['The solution states "Let x = 2.".', 'The solution states "Then y = x + 3.".',
                                               "The solution concludes that the answer is \\boxed{5}."]
    assert prepared[0]["reasoning_graph"] == [{"if_all": [2], "makes_obsolete": [1]}]
    assert prepared[1]["reasoning_points"] == ['The solution states "Multiply 4 by 2.".',
                                               "The solution concludes that the answer is \\boxed{8}."]
    assert prepared[1]["reasoning_graph"] == []
    assert [json.loads(line)["index"] for line in (out / FAILURES_FILE).read_text().splitlines()] == [2]


def test_prepare_input_errors(dataset_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    with JudgeServer() as server:
        with pytest.raises(ValueError, match=r"--reference-column 'reference' is not a column .*'solution'"):
            main(["--dataset", str(dataset_dir), "--reference-column", "reference", "--judge-model", "m",
                  "--out", str(tmp_path / "a")])
        out = tmp_path / "b"
        main(arguments(dataset_dir, server, out, "--limit", "1"))
        with pytest.raises(ValueError, match="different settings"):
            main(arguments(dataset_dir, server, out, "--limit", "1", "--problem-column", "solution"))
        assert server.requests == 2
    with pytest.raises(SystemExit):
        main(["--dataset", "x", "--reference-column", "r", "--judge-model", "m"])  # neither --out nor --push-to-hub


def test_problem_of_plain_and_conversational_cells():
    assert problem_of("What is 1 + 1?", "prompt", 0) == "What is 1 + 1?"
    chat = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "second"}]
    assert problem_of(chat, "prompt", 0) == "second"
    with pytest.raises(ValueError, match="row 3: column 'prompt'"):
        problem_of("  ", "prompt", 3)
