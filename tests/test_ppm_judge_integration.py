"""PPMGRPOTrainer with the LiteLLM judge over a real loopback HTTP server: progress from graded prefixes, no request
for an empty or unchanged prefix, a second identical run served from the cache, judge metrics logged."""

from __future__ import annotations

import os

import torch
from datasets import Dataset
from helpers import TINY_ARGS, capture_outputs, script_generation
from judge_server import JudgeServer

from ppm_trl.configs import PPMConfig
from ppm_trl.tiny import build_tiny_model_and_tokenizer
from ppm_trl.trainers.ppm import PPMGRPOTrainer

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
G, K = 4, 4


def _dataset():
    # The scripted judge grades a point YES when the rollout contains the point's quoted evidence.
    points = ['computes "alpha"', 'computes "beta"', 'states the final answer "\\boxed{7}"']
    return Dataset.from_list([{
        "prompt": [{"role": "user", "content": "Compute alpha, then beta, then the answer."}],
        "answer": "7", "reference": "alpha\nbeta\n\\boxed{7}", "reasoning_points": points,
        "reasoning_graph": [{"if_all": [3], "makes_obsolete": [1, 2]}],
    }])


def _completions():
    chunk = 16  # budget 64, K = 4
    return [
        "alpha".ljust(chunk) + "beta".ljust(chunk) + "\\boxed{7}",  # m = [1/3, 2/3, 1, -]
        "x" * chunk + "alpha".ljust(chunk) + "y" * 10,  # m = [0, 1/3, 1/3, -]
        "z" * 5,  # m = [0, -, -, -]
        "beta".ljust(chunk),  # m = [1/3]: only point 2
    ]


def _outcome(completions, **kwargs):
    return [1.0 if "\\boxed{7}" in c[0]["content"] else 0.0 for c in completions]


def _train(tmp_path, server):
    model, tokenizer = build_tiny_model_and_tokenizer()
    args = PPMConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=G,
                     max_completion_length=64, num_segments=K, max_steps=1, filter_zero_advantage_groups=False,
                     progress_scorer="judge", judge_model="openai/loopback-judge", judge_api_base=server.api_base,
                     judge_cache_dir=str(tmp_path / "cache"), judge_timeout=10, **TINY_ARGS)
    trainer = PPMGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=_outcome, args=args,
                             train_dataset=_dataset())
    texts = _completions()
    script_generation(trainer, lambda prompt, index: texts[index % G])
    outputs = capture_outputs(trainer)
    trainer.train()
    return trainer, outputs[0]["advantages"]


def test_ppm_with_loopback_judge(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback-dummy")
    with JudgeServer() as server:
        trainer, adv = _train(tmp_path, server)
        # One request per non-empty prefix that differs from the previous one: row0 3, row1 3, row2 1, row3 1.
        # Empty segments (rows 2 and 3 end in segment 1) send nothing.
        assert server.requests == 8
        first_run_requests = server.requests
        # Rewards (outcome on valid segments): row0 [1/3+1, 1/3+1, 1/3+1, 0]; row1 [0, 1/3, 0, 0];
        # row2 [0, 0, 0, 0]; row3 [1/3, 0, 0, 0]. Segment-1 mean (4/3 + 0 + 0 + 1/3)/4 = 5/12.
        assert torch.allclose(adv[0, :16], torch.full((16,), 4 / 3 - 5 / 12), atol=1e-5)
        assert torch.allclose(adv[3, :5], torch.full((5,), 1 / 3 - 5 / 12), atol=1e-5)
        # Segment 2 of row 1 (alpha reached there): 1/3 - mean(4/3, 1/3, 0, 0) = 1/3 - 5/12.
        assert torch.allclose(adv[1, 16:32], torch.full((16,), 1 / 3 - 5 / 12), atol=1e-5)
        logged = trainer.state.log_history[0]
        assert logged["ppm/scorer_requests"] == 8 and logged["ppm/scorer_failures"] == 0
        assert any(key.startswith("judge/") for key in logged)

        server.reset_counters()
        _train(tmp_path, server)  # same prompts, same prefixes: every grade comes from the on-disk cache
        assert server.requests == 0 and first_run_requests == 8
