"""LoRA through TRL's peft path for every trainer (CPU): the adapter trains, the base weights stay frozen."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from helpers import TINY_ARGS, script_generation
from peft import LoraConfig

from ppm_trl.arg.arg_config import ARGConfig
from ppm_trl.arg.arg_trainer import ARGTrainer
from ppm_trl.envs import make_dataset
from ppm_trl.papo.papo_config import PAPOConfig
from ppm_trl.papo.papo_trainer import PAPOTrainer
from ppm_trl.ppm.ppm_config import PPMConfig
from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer
from ppm_trl.rewards import accuracy_reward, env_outcome_reward, format_reward
from ppm_trl.tiny import build_tiny_model_and_tokenizer

COMMON = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=48, max_steps=2,
              learning_rate=1e-2, **TINY_ARGS)


def _countdown():
    return make_dataset("multi_countdown", 1, 2, seed=3)


def _arg_data():
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 3+4?"}]] * 2, "answer": ["7"] * 2,
                              "reference": ["So $3+4=7$.\n\\boxed{7}"] * 2})


CASES = {
    "ppm": (PPMGRPOTrainer, PPMConfig, _countdown, env_outcome_reward, {"filter_zero_advantage_groups": False}),
    "papo": (PAPOTrainer, PAPOConfig, _countdown, env_outcome_reward, {}),
    "arg": (ARGTrainer, ARGConfig, _arg_data, [accuracy_reward, format_reward],
            {"reward_weights": [1.0, 0.2], "warmup_steps": 0, "arg_num_continuations": 2, "arg_max_accepted": 2}),
}


@pytest.mark.parametrize("method", sorted(CASES))
def test_lora_trains_adapter_only(tmp_path, method):
    trainer_class, config_class, data, rewards, extra = CASES[method]
    dataset = data()
    model, tokenizer = build_tiny_model_and_tokenizer()
    args = config_class(output_dir=str(tmp_path), **{**COMMON, **extra})
    trainer = trainer_class(model=model, processing_class=tokenizer, reward_funcs=rewards, args=args,
                            train_dataset=dataset,
                            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    if method == "ppm":
        trainer.progress_scorer = lambda rows, texts: torch.linspace(0, 1, len(rows) * 4).view(len(rows), 4)
    references = {row["prompt"][0]["content"]: row["reference"] for row in dataset}

    def completion_for(prompt, index):  # half correct, half wrong: every method has a learning signal
        reference = next(r for p, r in references.items() if p in prompt)
        return reference if index % 2 == 0 else "wrong " * (index + 1)

    if method != "arg":  # ARG: the untrained model fails, so groups get guidance (its own generation path)
        script_generation(trainer, completion_for)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    lora = [n for n in before if "lora_" in n]
    assert lora, "no LoRA parameters: the peft config was not applied"
    assert any(not torch.equal(before[n], after[n]) for n in lora)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)
