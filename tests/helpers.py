"""Shared test helpers: tiny trainer configs and scripted generation (deterministic completions)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

TINY_ARGS = dict(
    use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
    seed=0, disable_tqdm=True,
)


def script_generation(trainer, completion_for):
    """Replace the trainer's generation backend (the base's public `sample_completion_ids`) by
    `completion_for(prompt_text, index_in_call) -> str` (EOS appended).

    The text goes through the real tokenizer, so everything downstream (masks, decoding, scoring, loss) is TRL's.
    """
    tokenizer = trainer.processing_class
    calls = []

    def scripted(prompt_ids, images=None, multimodal_fields=None, num_generations=1, has_tool_images=False):
        calls.append(len(prompt_ids))
        completions = []
        for index, ids in enumerate(prompt_ids):
            text = completion_for(tokenizer.decode(ids), index)
            completions.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return completions, None

    trainer.sample_completion_ids = scripted
    return calls


def capture_outputs(trainer):
    """Record every dict `_generate_and_score_completions` returns."""
    outputs = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        outputs.append({k: v.detach().clone() if hasattr(v, "detach") else v for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = spy
    return outputs
