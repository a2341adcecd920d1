"""README "Train on your own data", run as written: a GSM8K-shaped and a MATH-shaped JSONL through `prepare`,
`train --method ppm|papo|arg` and `eval`, through the installed `ppm-trl` entry point, against the loopback
OpenAI-compatible judge (tests/judge_server.py), with the tiny model and `--max_steps 2` (issue #18 item 7), on
messy files (issue 33 item 1): a row without an answer, a solution without its final line, a very long row, a
`\\fbox{}` answer and duplicates. (A chat without a reply: tests/cli/test_prepare_messy.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import readme_block
from judge_server import JudgeServer, scripted_judge

pytestmark = pytest.mark.slow  # 11 CLI runs, each importing torch + TRL: several minutes on 2 cores

ENTRY_POINT = Path(sys.executable).parent / "ppm-trl"
GSM8K = [{"question": f"Natalia sold {n} clips in April and half as many in May. How many in all?",
          "answer": f"In May she sold {n} / 2 = {n // 2} clips.\nIn all she sold {n} + {n // 2} = {n + n // 2}.\n"
                    f"#### {n + n // 2}"} for n in range(2, 42, 2)]
MATH = [{"problem": f"What is ${n} + {n + 1}$?",
         "solution": f"We add the two numbers: ${n} + {n + 1} = {2 * n + 1}$.\nSo the answer is $\\boxed{{{2 * n + 1}}}$."}
        for n in range(20)]
# What real files hold besides: rows that can never be used (left out and listed), a prompt longer than the tiny
# model's context (left out by `train`, counted), another box spelling, and repeated rows (judged once).
MESSY_GSM8K = [*GSM8K,
               {"question": "A row whose answer is missing?", "answer": None},
               {"question": "A row whose solution has no final line?", "answer": "She sold some clips in May."},
               {"question": "Long " + "word " * 3000 + "How many?", "answer": "It is 5.\n#### 5"},
               GSM8K[0], GSM8K[1]]
MESSY_MATH = [*MATH,
              {"problem": "Prove it.", "solution": "By induction on n."},
              {"problem": "What is $7 + 0$?", "solution": "Adding zero: \\fbox{7}."},
              MATH[0]]


def grading_judge(body: dict) -> str:
    """The scripted judge, except that a PPM grading request gets point 1 for about half of the rollouts (decided
    by a hash of the request), so the tiny untrained model's rollouts earn judge-graded progress."""
    answer = scripted_judge(body)
    system = next((m["content"] for m in body.get("messages", []) if m.get("role") == "system"), "")
    if "Section 2" in system and int(hashlib.sha256(json.dumps(body).encode()).hexdigest(), 16) % 2:
        head, grades = answer.rsplit("Section 2", 1)
        answer = head + "Section 2" + re.sub(r"^1\. NO$", "1. YES", grades, count=1, flags=re.MULTILINE)
    return answer


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


# 125 s alone on the 2-core machine (2026-12-06, `pytest --durations`): ≥ 10× that, above the commands' own bounds.
@pytest.mark.timeout(3600)
def test_readme_own_data_commands(tmp_path):
    _jsonl(tmp_path / "gsm8k.jsonl", MESSY_GSM8K)
    _jsonl(tmp_path / "math.jsonl", MESSY_MATH)
    _jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K[:3])
    _jsonl(tmp_path / "math_test.jsonl", MATH[:3])
    settings = readme_block("Train on your own data", "bash", index=0)
    commands = readme_block("Train on your own data", "bash", index=1)
    with JudgeServer(responder=grading_judge, max_lifetime=1800) as server:
        # The README's settings and commands as written; the test only points the model and the judges at the tiny
        # model and the loopback server, and appends `--max_steps 2` to RUN.
        test_settings = (
            'MODEL="--model_name_or_path tiny --use_cpu true"\n'
            f'PREPARE_JUDGE="--judge-model hosted_vllm/scripted-judge --api-base {server.api_base}"\n'
            f'TRAIN_JUDGE="--judge_model hosted_vllm/scripted-judge --judge_api_base {server.api_base}"\n'
            'RUN="$RUN --max_steps 2"\n')
        env = {key: value for key, value in os.environ.items()
               if not key.endswith("_API_KEY") and key != "LITELLM_LOCAL_MODEL_COST_MAP"}  # a local judge
        env.update(PATH=f"{ENTRY_POINT.parent}{os.pathsep}{env['PATH']}", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   WANDB_MODE="disabled", HF_DATASETS_DISABLE_PROGRESS_BARS="1")
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", settings + test_settings + commands], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]

    import datasets

    for shape, size, left_out in (("gsm8k", 23, [20, 21]), ("math", 22, [20])):
        prepared = datasets.load_from_disk(str(tmp_path / "data" / shape))
        assert {"prompt", "answer", "reference", "reasoning_points", "reasoning_graph"} <= set(prepared.column_names)
        assert len(prepared) == size  # every row but the ones that can never be prepared, duplicates included
        failures = [json.loads(line) for line in (tmp_path / "data" / shape / "prepare_failures.jsonl").open()]
        assert [(f["index"], f["retry"]) for f in failures] == [(index, False) for index in left_out]
    assert datasets.load_from_disk(str(tmp_path / "data" / "math"))["answer"][-2:] == ["7", "1"]  # \fbox{7}
    assert datasets.load_from_disk(str(tmp_path / "data" / "gsm8k"))["answer"][:2] == ["3", "6"]  # after ####
    assert datasets.load_from_disk(str(tmp_path / "data" / "math"))["answer"][:2] == ["1", "3"]  # last \boxed{}

    done = [json.loads(line.split("done ", 1)[1]) for line in result.stdout.splitlines()
            if line.startswith("ppm-trl train: done ")]
    assert [(d["method"], Path(d["output_dir"]).name) for d in done] == [
        ("ppm", "ppm_gsm8k"), ("papo", "papo_gsm8k"), ("arg", "arg_gsm8k"),
        ("ppm", "ppm_math"), ("papo", "papo_math"), ("arg", "arg_math"), ("arg", "arg_gsm8k_raw")]
    assert all(d["steps"] == 2 for d in done)
    assert all(Path(d["output_dir"]).is_absolute() for d in done)
    # PPM's 16 generations against TRL's batch of 8: the CLI fitted the batch and said so
    assert result.stderr.count("so gradient_accumulation_steps=2: each optimizer step trains on 16 completions") == 2  # ppm ×2
    pointers = [line for line in result.stderr.splitlines() if line.startswith("ppm-trl train: evaluate with: ")]
    assert len(pointers) == 7 and f"--model {tmp_path / 'outputs' / 'ppm_gsm8k'} --dataset_name" in pointers[0]
    assert "Failed to fetch remote model cost map" not in result.stderr  # offline: LiteLLM's local price map
    # The very long row: left out by each gsm8k run (3 on the prepared data, 1 on the raw file), counted.
    assert result.stderr.count("ppm-trl train: leaving out the prompts that do not fit: 1 of ") == 4
    # The raw file's unusable rows, listed in one line by the ARG run that reads it.
    assert "ppm-trl: left out 2 of 25 rows that cannot be used (rows 20, 21)" in result.stderr
    assert "Traceback" not in result.stderr
    for ppm in (done[0], done[3]):  # the judge graded the rollouts, and some reached a point
        assert ppm["metrics_mean"]["ppm/final_progress"] > 0, ppm
        assert ppm["metrics_mean"].get("ppm/unscorable_frac", 0) < 1, ppm
    from huggingface_hub import ModelCard

    for d in done:  # a model card in every output dir
        card = ModelCard.load(tmp_path / d["output_dir"] / "README.md")
        assert {"ppm-trl", d["method"]} <= set(card.data.tags)

    evals = [json.loads(line.split("ppm-trl eval: ", 1)[1]) for line in result.stdout.splitlines()
             if line.startswith("ppm-trl eval: {")]
    assert [(e["dataset"], e["problems"], e["samples_per_problem"]) for e in evals] == [
        ("gsm8k_test.jsonl", 3, 8), ("math_test.jsonl", 3, 8)]  # the README's SAMPLES
    assert all({"pass@1", "pass@8", "avg@8"} <= set(e) for e in evals)
    written = json.loads((tmp_path / "eval_math.json").read_text())
    assert [p["answer"] for p in written["per_problem"]] == ["1", "3", "5"]
    assert all(len(p["completions"]) == len(p["correct"]) == 8 for p in written["per_problem"])
