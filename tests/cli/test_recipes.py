"""README "Recipes", run as written (issue 43 item 3): the papers' datasets cannot be downloaded here, so each is a
local `save_to_disk` copy of a few rows with the dataset's columns and splits (the columns the papers' code reads:
the PPM authors' Polaris loader reads problem/answer/gemini_solution/rubric/rubric_model/makes_obsolete_*;
NuminaMath-1.5's and DeepMath-103K's dataset cards; MATH-500's, AIME 2024's and AIME 2025's Hub copies), and the
README's dataset variables point at them. The recipes' configs run through `prepare` → `train` (one step, the tiny
model, LoRA as configured) → `eval` with the installed `ppm-trl`, the judges at the loopback server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import readme_block
from judge_server import JudgeServer
from test_own_data import grading_judge

pytestmark = pytest.mark.slow  # 7 CLI runs, each importing torch + TRL

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINT = Path(sys.executable).parent / "ppm-trl"

POLARIS = [  # prestonfu/polaris-acemath-gemini-rubrics-v2, split train_boxed
    {"problem": f"Compute ${a} + {b} \\cdot {c}$.", "answer": str(a + b * c),
     "gemini_solution": f"First ${b} \\cdot {c} = {b * c}$.\nThen ${a} + {b * c} = {a + b * c}$.\n\n\\boxed{{{a + b * c}}}",
     "rubric": rubric, "rubric_model": "gemini-3-flash-preview", "makes_obsolete_sparse": "",
     "makes_obsolete_medium": "", "makes_obsolete_dense": graph, "mean_reward": 0.25}
    for (a, b, c), rubric, graph in [
        ((2, 3, 4), "1. Computes 3 * 4 = 12.\n2. Adds 2 to get 14.", "[([2], [1])]"),
        ((5, 6, 7), "1. Computes 6 * 7 = 42.\n2. Adds 5.", "[([2], [1])]"),  # the answer 47 is never stated
        ((1, 2, 8), "1. Computes 2 * 8 = 16.\n   (the product first)\n2. The answer is 17.", ""),  # a wrapped line
        ((9, 2, 2), "1. Computes 2 * 2 = 4.\n2. Adds 9 to get 13.", "[([1], [5])]"),  # item 5 does not exist
    ]]
NUMINA = [  # nlile/NuminaMath-1.5-RL-Verifiable (NuminaMath-1.5's columns), split train
    {"problem": f"What is ${n} \\times 3$?", "solution": f"${n} \\times 3 = {3 * n}$, so $\\boxed{{{3 * n}}}$.",
     "answer": str(3 * n), "problem_type": "Algebra", "question_type": "math-word-problem", "problem_is_valid": "Yes",
     "solution_is_valid": "Yes", "source": "olympiads", "synthetic": False} for n in range(2, 10)]
DEEPMATH = [  # zwhe99/DeepMath-103K, split train
    {"question": f"Find ${n}^2$.", "final_answer": str(n * n), "difficulty": 5.5, "topic": "Mathematics -> Algebra",
     "r1_solution_1": f"<think>\nSquare it.\n</think>\n${n}^2 = {n * n}$, so the answer is $\\boxed{{{n * n}}}$.",
     "r1_solution_2": f"$\\boxed{{{n * n}}}$", "r1_solution_3": f"$\\boxed{{{n * n}}}$"} for n in range(2, 10)]
MATH500 = [  # HuggingFaceH4/MATH-500, split test
    {"problem": f"What is ${n} + {n}$?", "solution": f"${n} + {n} = {2 * n}$, so $\\boxed{{{2 * n}}}$.",
     "answer": str(2 * n), "subject": "Prealgebra", "level": 1, "unique_id": f"test/prealgebra/{n}.json"}
    for n in range(3)]
AIME24 = [  # HuggingFaceH4/aime_2024, split train
    {"id": 60 + n, "problem": f"Find {n} + 1.", "solution": f"It is {n + 1}.", "answer": str(n + 1),
     "url": "https://artofproblemsolving.com/wiki/", "year": "2024"} for n in range(3)]
AIME25 = [{"problem": f"Find {n} + 2.", "answer": str(n + 2), "id": str(n)} for n in range(3)]  # math-ai/aime25, test


def _save(path: Path, split: str, rows: list[dict]) -> str:
    import datasets

    datasets.DatasetDict({split: datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    return str(path)


def test_readme_recipes_run_as_written(tmp_path):
    fixtures = {"POLARIS": _save(tmp_path / "polaris", "train_boxed", POLARIS),
                "NUMINA": _save(tmp_path / "numina", "train", NUMINA),
                "DEEPMATH": _save(tmp_path / "deepmath", "train", DEEPMATH),
                "MATH500": _save(tmp_path / "math500", "test", MATH500),
                "AIME24": _save(tmp_path / "aime24", "train", AIME24),
                "AIME25": _save(tmp_path / "aime25", "test", AIME25)}
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the commands name configs/recipes/... from the repo root
    settings = readme_block("Recipes: the papers' own settings", "bash", index=0)
    commands = readme_block("Recipes: the papers' own settings", "bash", index=1)
    with JudgeServer(responder=grading_judge, max_lifetime=1800) as server:
        judge = f"--judge_model hosted_vllm/scripted-judge --judge_api_base {server.api_base}"
        test_settings = "".join(f"{name}={path}\n" for name, path in fixtures.items()) + (
            f'PPM_JUDGE="{judge}"\nPRM_JUDGE="{judge}"\n'
            'RUN="--model_name_or_path tiny --use_cpu true --bf16 false --dtype float32 --use_vllm false '
            '--max_steps 1 --max_completion_length 24 --num_generations 8 --per_device_train_batch_size 8 '
            '--gradient_accumulation_steps 1"\n'
            'EVAL="--max_new_tokens 8 --max_problems 2"\n')
        env = {key: value for key, value in os.environ.items() if not key.endswith("_API_KEY")}
        env.update(PATH=f"{ENTRY_POINT.parent}{os.pathsep}{env['PATH']}", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   WANDB_MODE="disabled", HF_DATASETS_DISABLE_PROGRESS_BARS="1")
        prepare, train = commands.split("\nppm-trl train", 1)
        # `prepare` first, on its own: the requests the server has seen by then are prepare's
        first = subprocess.run(["bash", "-euo", "pipefail", "-c", settings + test_settings + prepare], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        prepare_requests = server.requests
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", settings + test_settings + "ppm-trl train" + train],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert prepare_requests == 0  # the authors' points and graphs: no judge call

    import datasets

    prepared = datasets.load_from_disk(str(tmp_path / "data" / "polaris"))
    assert prepared["reasoning_points"] == [
        ["Computes 3 * 4 = 12.", "Adds 2 to get 14."],
        ["Computes 6 * 7 = 42.", "Adds 5.", "The final answer is \\boxed{47}."],  # the answer point appended
        ["Computes 2 * 8 = 16. (the product first)", "The answer is 17."]]
    assert prepared["reasoning_graph"] == [[{"if_all": [2], "makes_obsolete": [1]}],
                                           [{"if_all": [2], "makes_obsolete": [1]}], []]
    assert prepared["answer"] == ["14", "47", "17"]
    failures = [json.loads(line) for line in (tmp_path / "data" / "polaris" / "prepare_failures.jsonl").open()]
    assert [(f["index"], f["kind"], f["retry"]) for f in failures] == [(3, "bad_given_points", False)]
    assert "column 'makes_obsolete_dense'" in failures[0]["reason"] and "item 5 is out of range" in failures[0]["reason"]
    assert "a final-answer point appended to 1 " in first.stdout

    done = [json.loads(line.split("done ", 1)[1]) for line in result.stdout.splitlines()
            if line.startswith("ppm-trl train: done ")]
    assert [(d["method"], Path(d["output_dir"]).name, d["steps"]) for d in done] == [
        ("ppm", "ppm_polaris", 1), ("papo", "papo_numina", 1), ("arg", "arg_deepmath", 1)]
    assert done[0]["metrics_mean"]["ppm/scorer_requests"] > 0  # the judge graded the rollouts' prefixes
    assert done[0]["judge_totals"]["calls"] > 0
    from huggingface_hub import ModelCard

    for d in done:  # every recipe trains a LoRA adapter, and its card says so
        card = ModelCard.load(Path(d["output_dir"]) / "README.md")
        assert "Weights: LoRA, r 64, alpha 128" in card.text, card.text[:2000]
    evals = [json.loads(line.split("ppm-trl eval: ", 1)[1]) for line in result.stdout.splitlines()
             if line.startswith("ppm-trl eval: {")]
    assert [(e["dataset"], e["problems"], e["samples_per_problem"]) for e in evals] == [
        (fixtures["AIME25"], 2, 8), (fixtures["MATH500"], 2, 4), (fixtures["AIME24"], 2, 12)]
    assert {"pass@1", "pass@8"} <= set(evals[0]) and {"pass@12", "avg@12"} <= set(evals[2])
    written = json.loads((tmp_path / "eval_arg_aime24.json").read_text())
    assert [p["answer"] for p in written["per_problem"]] == ["1", "2"]
    assert "Traceback" not in result.stderr
