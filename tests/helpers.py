"""Shared test helpers: tiny trainer configs and scripted generation (deterministic completions)."""

from __future__ import annotations

import os
import re
from pathlib import Path

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


# The trainer argument each method's scorer goes to (a callable there; the config field of the same name takes a name)
SCORER_KEYWORDS = {"ppm": "progress_scorer", "ppm+arg": "progress_scorer", "papo": "process_scorer",
                   "papo+arg": "process_scorer"}


def build_trainer(method: str, output_dir, *, scorer=None, reward_funcs=None, train_dataset=None, eval_dataset=None,
                  **settings):
    """A trainer of the registered `method` ("ppm", "papo", "arg", "ppm+arg", "papo+arg") on the tiny model, its
    config `TINY_ARGS` with `settings` and `output_dir`: by default on the multi_countdown env (2 steps, 4 rows,
    seed 0) with its outcome reward. `scorer`: the method's progress or process scorer (a callable)."""
    from ppm_trl.envs import make_dataset
    from ppm_trl.registry import get_method
    from ppm_trl.rewards import env_outcome_reward
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    registered = get_method(method)
    model, tokenizer = build_tiny_model_and_tokenizer()
    args = registered.config_class()(output_dir=str(output_dir), **{**TINY_ARGS, **settings})
    extra = {} if scorer is None else {SCORER_KEYWORDS[method]: scorer}
    return registered.trainer_class()(
        model=model, processing_class=tokenizer, args=args,
        reward_funcs=env_outcome_reward if reward_funcs is None else reward_funcs,
        train_dataset=make_dataset("multi_countdown", 2, 4, seed=0) if train_dataset is None else train_dataset,
        eval_dataset=eval_dataset, **extra)


REPO = Path(__file__).resolve().parents[1]


def readme_block(section: str, language: str, index: int = 0) -> str:
    """The `index`-th ```language block under the `## section` heading of README.md."""
    text = (REPO / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", body, re.DOTALL)
    assert len(blocks) > index, f"README section {section!r} has no {language} block {index}"
    return blocks[index]
