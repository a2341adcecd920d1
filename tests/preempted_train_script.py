"""A tiny PPM run (programmatic scorer, scripted completions) that sends itself SIGTERM at step 2, for
tests/trainers/test_checkpoint_resume.py: `python preempted_train_script.py OUTPUT_DIR {during_save|during_step|ctrl_c|none}
MAX_STEPS [resume_from_checkpoint]` (`ctrl_c`: SIGINT while step 2 generates, saving on). Prints `steps trained: N` when `train` returns."""

from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))
from helpers import TINY_ARGS, script_generation  # noqa: E402

from ppm_trl.envs import make_dataset  # noqa: E402
from ppm_trl.ppm.ppm_config import PPMConfig
from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer
from ppm_trl.rewards import env_outcome_reward  # noqa: E402
from ppm_trl.tiny import build_tiny_model_and_tokenizer  # noqa: E402


def main(output_dir: str, when: str, max_steps: int, resume: str | None) -> None:
    model, tokenizer = build_tiny_model_and_tokenizer()
    save = {"save_strategy": "steps", "save_steps": 1} if when not in ("during_step", "ctrl_c") else {"save_strategy": "no"}
    args = PPMConfig(output_dir=output_dir, per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=16, num_segments=2, max_steps=max_steps, **{**TINY_ARGS, **save})
    trainer = PPMGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=env_outcome_reward, args=args,
                             train_dataset=make_dataset("multi_add", 2, 8, seed=0))
    generations = script_generation(trainer, lambda prompt, index: "1")
    if when == "during_save":  # SIGTERM arrives while checkpoint-2 is being written (its model is on disk)
        original = trainer.save_model

        def save_model(*a, **kw):
            original(*a, **kw)
            if trainer.state.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

        trainer.save_model = save_model
    elif when in ("during_step", "ctrl_c"):  # SIGTERM / SIGINT arrives while step 2 generates
        original_sample = trainer.sample_completion_ids

        def sample(*a, **kw):
            if trainer.state.global_step == 1:
                os.kill(os.getpid(), signal.SIGTERM if when == "during_step" else signal.SIGINT)
            return original_sample(*a, **kw)

        trainer.sample_completion_ids = sample
    trainer.train(resume_from_checkpoint=resume)
    print(f"steps trained: {len(generations)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
