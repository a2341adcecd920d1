"""`ppm-trl prepare` against the loopback judge: columns, answer extraction, validation, real failure reasons,
the judge probe, resume after an interruption (and after a real Ctrl-C)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402
from judge_server import GARBAGE_TEXT, JudgeServer, scripted_judge  # noqa: E402

from ppm_trl.columns import (
    gsm8k_answer,  # noqa: E402
    problem_of,
)
from ppm_trl.data import FAILURES_FILE, PROGRESS_FILE
from ppm_trl.judge import JudgeConfigurationError  # noqa: E402
from ppm_trl.judge.answers import states_answer  # noqa: E402
from ppm_trl.judge.client import PROBE_MAX_TOKENS  # noqa: E402
from ppm_trl.prepare import main

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


def grading_requests(server) -> int:
    """Requests other than the judge probe."""
    return sum(body.get("max_tokens") != PROBE_MAX_TOKENS for body in server.bodies)


def failures_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / FAILURES_FILE).read_text().splitlines()]


def flaky_on(problem: str):
    """A judge that answers garbage to the rubric request of one problem (a row that fails this run)."""

    def respond(body: dict) -> str:
        user = body["messages"][-1]["content"]
        if "Generate a rubric" in body["messages"][0]["content"] and problem in user:
            return GARBAGE_TEXT
        return scripted_judge(body)

    return respond


def test_prepare_resumes_and_validates(dataset_dir, tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    out = tmp_path / "prepared"
    with JudgeServer(responder=flaky_on("4 * 2")) as server:
        with pytest.raises(SystemExit) as exited:
            main(arguments(dataset_dir, server, out, "--answer-column", "answer"))
        first_requests = grading_requests(server)
    assert exited.value.code == 1
    assert ("the judge could not prepare 2 row(s) this time (2 with an unreadable judge answer; first, row 1: judge "
            "answered but no readable <rubric>") in capsys.readouterr().err
    assert first_requests == 4  # rows 0 and 2 rubric, row 0 graph; row 1 rubric (garbage)
    progress = [json.loads(line) for line in (out / PROGRESS_FILE).read_text().splitlines()]
    assert [record.get("index") for record in progress] == [None, 0]  # the settings line, then row 0
    failures = failures_of(out)
    assert [f["index"] for f in failures] == [1, 2] and "'6'" in failures[1]["reason"]
    assert [(f["stage"], f["kind"], f["retry"]) for f in failures] == [("rubric", "unreadable", True)] * 2

    # The rerun (fresh cache: resume must not rely on it) only asks for the rows that are not done yet.
    with JudgeServer() as server:
        main(arguments(dataset_dir, server, out, "--answer-column", "answer", "--cache-dir", str(tmp_path / "fresh"),
                       "--drop-invalid"))
        assert grading_requests(server) == 3  # row 1 rubric + graph, row 2 rubric (still invalid)
    prepared = datasets.load_from_disk(str(out))
    assert prepared["answer"] == ["5", "8"]  # row 2 dropped, as listed in the failures file
    assert prepared["prompt"] == ROWS["prompt"][:2]  # conversational prompts are kept as they are
    assert prepared["reference"] == ROWS["solution"][:2] and prepared["solution"] == ROWS["solution"][:2]
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
        assert grading_requests(server) == 2
        with pytest.raises(ValueError, match=r"--problem-column 'question' is not a column of .*; its columns are \["):
            main(arguments(dataset_dir, server, tmp_path / "c", "--problem-column", "question"))
        with pytest.raises(ValueError, match=r"--answer-column 'gold' is not a column"):
            main(arguments(dataset_dir, server, tmp_path / "c", "--answer-column", "gold"))
    with pytest.raises(SystemExit):
        main(["--dataset", "x", "--reference-column", "r", "--judge-model", "m"])  # neither --out nor --push-to-hub


def test_problem_of_plain_and_conversational_cells():
    assert problem_of("What is 1 + 1?", "prompt", 0) == "What is 1 + 1?"
    chat = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "second"}]
    assert problem_of(chat, "prompt", 0) == "second"
    with pytest.raises(ValueError, match="row 3: column 'prompt'"):
        problem_of("  ", "prompt", 3)


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


GSM8K = [  # the GSM8K shape: `answer` holds the worked solution, its last line the final answer
    {"question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
     "answer": "In May she sold 48 / 2 = 24 clips.\nIn total she sold 48 + 24 = 72 clips.\n#### 72"},
    {"question": "Weng earns $12 an hour. How much for 50 minutes?",
     "answer": "Per minute she earns 12 / 60 = 0.2.\nFor 50 minutes she earns 0.2 * 50 = 10.\n#### 10"},
    {"question": "A shop sells 1000 pens a day. How many in 2 days?", "answer": "It sells 1000 * 2 pens.\n#### 2,000"},
]


def test_gsm8k_shape_trains_as_is(tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    data = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    out = tmp_path / "prepared"
    with JudgeServer() as server:
        main(["--dataset", data, "--problem-column", "question", "--reference-column", "answer",
              "--judge-model", "openai/scripted-judge", "--api-base", server.api_base, "--out", str(out),
              "--num-retries", "0", "--no-progress"])
    printed = capsys.readouterr().out
    assert "GSM8K-style answers: 3/3 extracted ('#### ' line of 'answer')" in printed
    assert "the input column 'answer' is replaced by the gold final answers; its values are kept as 'original_answer'" \
        in printed
    prepared = datasets.load_from_disk(str(out))
    assert set(prepared.column_names) == {"question", "original_answer", "prompt", "answer", "reference",
                                          "reasoning_points", "reasoning_graph"}
    assert prepared["answer"] == ["72", "10", "2000"]
    assert prepared["prompt"][0] == [{"role": "user", "content": GSM8K[0]["question"]}]
    assert prepared["original_answer"] == [row["answer"] for row in GSM8K]
    # One rule with `train --reference_column` on the raw file: the `####` line becomes a \boxed{} final answer,
    # the marker ARG's guidance keeps in the suffix.
    assert prepared["reference"] == [row["answer"].rsplit("####", 1)[0] + "\\boxed{" + gold + "}"
                                     for row, gold in zip(GSM8K, ["72", "10", "2000"])]
    from ppm_trl.columns import boxed_reference

    assert prepared["reference"] == [boxed_reference(row["answer"]) for row in GSM8K]
    assert prepared[0]["reasoning_points"][-1].endswith("\\boxed{#### 72}.")
    assert not (out / FAILURES_FILE).read_text()


def test_math_shape_row_without_answer_is_skipped_before_any_judge_call(tmp_path, monkeypatch, capsys):
    import datasets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    rows = [{"problem": "What is 6 * 7?", "solution": "Six sevens.\nThat is $\\boxed{42}$."},
            {"problem": "Prove the claim.", "solution": "By induction on n, it holds."},
            {"problem": "Half of 1?", "solution": "Divide.\nSo \\boxed{\\frac{1}{2}}"}]
    data = write_jsonl(tmp_path / "math.jsonl", rows)
    out = tmp_path / "prepared"
    with JudgeServer() as server:
        main(["--dataset", data, "--problem-column", "problem", "--reference-column", "solution", "--judge-model",
              "openai/scripted-judge", "--api-base", server.api_base, "--out", str(out), "--drop-invalid",
              "--no-progress"])
        asked = json.dumps(server.bodies)
    assert "Prove the claim" not in asked and "By induction" not in asked  # no judge call spent on row 1
    printed = capsys.readouterr().out
    assert ("MATH-style answers: 2/3 extracted (last \\boxed{} of 'solution'); no answer found: 1/3 (skipped, listed "
            "in prepare_failures.jsonl)") in printed
    assert "leaving out 1 row(s) that can never be prepared as they are (1 without a final answer (no judge call))" \
        in printed
    assert failures_of(out) == [{"index": 1, "stage": "answer", "kind": "no_answer", "reason":
                                 "no final answer: column 'solution' has no \\boxed{} and no '#### ' line in this row",
                                 "retry": False}]
    prepared = datasets.load_from_disk(str(out))
    assert prepared["answer"] == ["42", "\\frac{1}{2}"] and prepared["problem"] == ["What is 6 * 7?", "Half of 1?"]


def test_answer_check_uses_math_verify():
    assert states_answer("The solution concludes that the answer is \\boxed{72}.", "72")
    assert states_answer("She earns 72.0 dollars in total.", "72")
    assert states_answer("The answer is 72.", "\\$72")
    assert states_answer("Final answer: $72", "72.0")
    assert states_answer("So the probability is $\\frac{1}{2}$.", "0.5")
    assert states_answer("The answer is (B).", "B")  # not a number: normalised containment
    assert not states_answer("The answer is 720.", "72")
    assert not states_answer("The final answer is 5.", "6")
    assert gsm8k_answer("a\n#### 1,234\n") == "1234" and gsm8k_answer("no marker") is None


def test_judge_request_errors_are_reported_as_such(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    data = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K[:2])
    out = tmp_path / "prepared"
    # vLLM with a context shorter than the rubric prompt: HTTP 400 to every request (the probe only warns on it).
    with JudgeServer(fault_rate=1.0, fault_kinds=("context_length",)) as server:
        with pytest.raises(SystemExit) as exited:
            main(["--dataset", data, "--problem-column", "question", "--reference-column", "answer",
                  "--judge-model", "openai/scripted-judge", "--api-base", server.api_base, "--out", str(out),
                  "--no-progress", "--transport", "openai_http"])
        assert server.requests == 3  # the probe, then one rubric request per row: a 400 is not retried
    assert exited.value.code == 1  # no row could be prepared
    failures = failures_of(out)
    # A row the judge refuses (HTTP 4xx) is refused again on a rerun: left out, not "retry".
    assert [(f["index"], f["stage"], f["kind"], f["retry"]) for f in failures] == [
        (0, "rubric", "request_error", False), (1, "rubric", "request_error", False)]
    assert failures[0]["reason"].startswith("judge request failed (rubric) after 1 attempt(s): HTTPStatusError "
                                            "(HTTP 400): ")
    assert "maximum context length is 1024 tokens" in failures[0]["reason"]
    captured = capsys.readouterr()
    assert "leaving out 2 row(s) that can never be prepared as they are (2 with a judge request error)" in captured.out
    assert "no row could be prepared, so no dataset is written" in captured.err
    assert "no readable <rubric>" not in captured.err + captured.out


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_prepare_probes_the_judge_before_any_work(tmp_path, monkeypatch, transport):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-0123")
    data = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    command = ["--dataset", data, "--problem-column", "question", "--reference-column", "answer", "--judge-model",
               "openai/scripted-judge", "--out", str(tmp_path / "prepared"), "--no-progress", "--transport", transport]
    with JudgeServer(require_key="sk-right-4567") as server:
        with pytest.raises(JudgeConfigurationError, match=r"judge model 'openai/scripted-judge' at api_base=http://"
                                                          r".*the API key was refused or is missing \(HTTP 401\); key "
                                                          r"variable OPENAI_API_KEY is set"):
            main([*command, "--api-base", server.api_base])
        assert server.requests == 1  # only the probe: no row's work was spent
    monkeypatch.delenv("OPENAI_API_KEY")
    with JudgeServer() as server:  # a local server that needs no key: nothing to set, with either transport
        main([*command, "--api-base", server.api_base, "--num-retries", "0"])
        assert server.requests == 1 + 2 * len(GSM8K)


def _as_from_a_shell() -> None:
    """A child sees Ctrl-C as a shell's child does: SIGINT unblocked, default action (Python installs its handler).
    A child inherits a blocked or ignored SIGINT from the forking thread; earlier tests' libraries can leave one."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _as_a_background_job() -> None:
    """A child as a shell's `&` starts it: SIGINT ignored (issue 44: prepare then never stopped on it)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("started", [_as_from_a_shell, _as_a_background_job], ids=["foreground", "background"])
def test_ctrl_c_prints_one_line_and_exits_130(tmp_path, started):
    data = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": f"Q{i}?", "answer": f"Step {i}.\n#### {i}"}
                                                  for i in range(20)])
    out = tmp_path / "prepared"
    env = {**os.environ, "OPENAI_API_KEY": "sk-loopback-dummy-key", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "PYTHONUNBUFFERED": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    with JudgeServer(latency=0.3) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "ppm_trl.prepare", "--dataset", data, "--problem-column", "question",
             "--reference-column", "answer", "--judge-model", "openai/scripted-judge", "--api-base", server.api_base,
             "--out", str(out), "--max-concurrency", "1", "--no-progress"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=started)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:  # wait until some rows are finished
            progress = out / PROGRESS_FILE
            if progress.exists() and len(progress.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    finished = len((out / PROGRESS_FILE).read_text().splitlines()) - 1  # minus the settings line
    assert 2 <= finished < 20
    assert stderr.strip().splitlines() == [
        f"ppm-trl prepare: interrupted after {finished}/20 rows; rerun the same command to resume"]


def test_ctrl_c_delivered_to_the_judge_loop_thread_still_interrupts_at_once():
    """The kernel may hand SIGINT to any thread; Python runs the handler in the main thread only when it wakes.
    A main thread blocked in one `future.result()` slept through it until every row was done (a flaky exit 0).
    The signal is raised in a child process (`ctrl_c_in_loop_thread_script.py`), never in pytest's own: one that
    lands after the code under test returned would interrupt the whole test session."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ctrl_c_in_loop_thread_script.py")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    child = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600,
                           preexec_fn=_as_from_a_shell)
    assert child.returncode == 0, child.stdout + child.stderr[-3000:]
    assert child.stdout.splitlines() == [
        "interrupted: interrupted after 2/20 rows; rerun the same command to resume",
        "work finished: False",  # cancelled, not waited for
    ]


def test_prepare_keeps_a_judge_cache_by_default(dataset_dir, tmp_path, monkeypatch):
    """Without --cache-dir the answers are cached in <work dir>/judge_cache: a second prepare of the same rows (its
    progress files gone, as for a concurrent run) pays for nothing; `--cache-dir none` keeps no cache."""
    import shutil

    from ppm_trl.prepare import judge_cache_dir

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out = tmp_path / "out"
    with JudgeServer() as server:
        main(arguments(dataset_dir, server, out, "--answer-column", "answer", "--drop-invalid"))
        first = grading_requests(server)
        assert first > 0 and (out / "judge_cache").is_dir()
        for entry in out.iterdir():
            if entry.name != "judge_cache":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        main(arguments(dataset_dir, server, out, "--answer-column", "answer", "--drop-invalid"))
        # Every answer came from the cache but row 2's rubric, which fails its check (such answers are never
        # cached); without a cache the second run sent all of them again.
        assert grading_requests(server) == first + 1
    assert judge_cache_dir(None, "w") == os.path.join("w", "judge_cache")
    assert judge_cache_dir("none", "w") is None and judge_cache_dir(" None ", "w") is None
    assert judge_cache_dir("/c", "w") == "/c"


def test_a_resumed_prepare_matches_records_to_rows_by_content_not_by_index(tmp_path, monkeypatch, capsys):
    """Issue 41: delete the row prepare asked the user to fix and rerun — every later row used to get its
    neighbour's points (resume by index). Records follow their row's content: moved rows keep theirs (no judge
    call), a changed row is judged again, a corrupt record is not a finished row."""
    import datasets

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    questions = ["What is 2 + 3?", "What is 4 * 2?", "What is 9 - 4?", "What is 7 + 7?"]
    solutions = ["So \\boxed{5}.", "Multiply.\nSo \\boxed{8}.", "Subtract.\nSo \\boxed{5}.", "Add.\nSo \\boxed{14}."]
    data = tmp_path / "data"
    datasets.Dataset.from_dict({"prompt": questions, "solution": solutions}).save_to_disk(str(data))
    out = tmp_path / "prepared"
    with JudgeServer(responder=flaky_on("4 * 2")) as server, pytest.raises(SystemExit):
        main(arguments(data, server, out))  # row 1 fails: "fix it in the dataset"
    with (out / PROGRESS_FILE).open("a") as progress:  # and two records no prepare wrote
        progress.write(json.dumps({"index": 1e400}) + "\n" + json.dumps({"index": None}) + "\n")
    # The user deletes row 1 and edits the last row's solution, then reruns the same command.
    kept = [0, 2, 3]
    edited = [solutions[i] for i in kept]
    edited[2] = "Add seven.\nSo \\boxed{14}."
    shutil.rmtree(data)
    datasets.Dataset.from_dict({"prompt": [questions[i] for i in kept], "solution": edited}).save_to_disk(str(data))
    with JudgeServer() as server:
        main(arguments(data, server, out, "--cache-dir", str(tmp_path / "fresh")))
        assert grading_requests(server) == 2  # the edited row only: rubric and graph; "9 - 4" kept its record
    assert "1 record(s) of" in capsys.readouterr().out  # the old last row's record matches no row now
    prepared = datasets.load_from_disk(str(out))
    for row in prepared:  # each row's last point concludes its own answer
        assert row["reasoning_points"][-1].endswith(f"\\boxed{{{row['answer']}}}.")
    assert prepared["answer"] == ["5", "5", "14"]
    assert any("Add seven." in point for point in prepared[2]["reasoning_points"])


def test_push_to_hub_writes_a_dataset_card(dataset_dir, tmp_path, monkeypatch):
    """Issue 43 item 3: `prepare --push-to-hub` uploaded a dataset without a card (source, judge, rows left out)."""
    import datasets
    from huggingface_hub import DatasetCard

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy-key")
    pushed = {}
    monkeypatch.setattr(datasets.Dataset, "push_to_hub", lambda self, repo, **kw: pushed.update(rows=len(self)))
    monkeypatch.setattr(DatasetCard, "push_to_hub", lambda self, repo, **kw: pushed.update(card=str(self), repo=repo))
    monkeypatch.chdir(tmp_path)
    with JudgeServer() as server:
        main(["--dataset", str(dataset_dir), "--reference-column", "solution", "--answer-column", "answer",
              "--judge-model", "openai/scripted-judge", "--api-base", server.api_base, "--push-to-hub",
              "someone/prepared", "--num-retries", "0", "--no-progress", "--drop-invalid"])
    card = pushed["card"]
    assert pushed["repo"] == "someone/prepared" and pushed["rows"] == 2
    assert f"Source: `{dataset_dir}`" in card and "Judge model: `openai/scripted-judge`" in card
    assert "Rows: 2 of 3 kept; left out 1 (1 with an unreadable judge answer)" in card
    assert "judge prompts sha256 `" in card
