"""Per-step overhead of PPMGRPOTrainer / PAPOTrainer / ARGTrainer against plain GRPOTrainer, in the same run.

Every trainer trains the same tiny model from the same seed on the same synthetic batch shape (real HF generation
on CPU). Besides whole-step ratios (which include the partial-credit scorer: the programmatic matcher here, an LLM
judge in real runs), the method-specific work is timed by wrapping the trainer's own pieces:

* PPM: prefix lengths + segmentation + segment advantages + token expansion + metrics — the issue's "< 2% of a
  training step" target — and, separately, the progress scorer (judge latency in real runs).
* PAPO: everything PAPO adds except the process scorer (judge latency excluded) — target ≤ 2% of a GRPO step.
* ARG: the extra time per step on a task the model always fails, against the time plain generation takes for the
  same number of extra sequences (target ≤ 1.2×).

    python benchmarks/overhead.py [--steps 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from ppm_trl.configs import PAPOConfig, PPMConfig  # noqa: E402
from ppm_trl.envs import make_dataset  # noqa: E402
from ppm_trl.rewards import env_outcome_reward  # noqa: E402
from ppm_trl.tiny import build_tiny_model_and_tokenizer  # noqa: E402

COMMON = dict(use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no",
              logging_steps=10_000, disable_tqdm=True, seed=0, learning_rate=1e-5, per_device_train_batch_size=16,
              num_generations=8, max_completion_length=96, temperature=1.0)


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


def timed(owner, name, totals):
    """Wrap `owner.name` so its wall time accumulates in totals[name]."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    setattr(owner, name, wrapper)


class TimedScorer:
    """Wraps a scorer so its wall time accumulates in totals["scorer"] (dunder calls bypass instance patches)."""

    def __init__(self, inner, totals):
        self.inner, self.totals = inner, totals
        self.stats = getattr(inner, "stats", {})

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.totals["scorer"] += time.perf_counter() - start


def mix_in_references(trainer, dataset):
    """After real generation, every other completion is replaced by its reference solution (the same for every
    trainer), so groups are mixed: the scorers and judges have correct responses and progress to grade."""
    tokenizer = trainer.processing_class
    references = {row["prompt"][0]["content"]: row["reference"] for row in dataset}
    generate = trainer._generate_single_turn

    def generate_then_mix(prompt_ids, *args, **kwargs):
        completion_ids, logprobs = generate(prompt_ids, *args, **kwargs)
        for i in range(0, len(completion_ids), 2):
            prompt = tokenizer.decode(prompt_ids[i])
            reference = next(r for p, r in references.items() if p in prompt)
            completion_ids[i] = tokenizer(reference, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return completion_ids, logprobs

    trainer._generate_single_turn = generate_then_mix


def run(trainer_class, config_class, steps, dataset, pieces=(), scorer_attr=None, **extra):
    """Median step time after 2 warm-up steps, and the mean per-step time of each wrapped piece."""
    model, tokenizer = build_tiny_model_and_tokenizer(seed=0, hidden_size=64, num_hidden_layers=2)
    args = config_class(output_dir=tempfile.mkdtemp(), max_steps=steps, **{**COMMON, **extra})
    trainer = trainer_class(model=model, processing_class=tokenizer, reward_funcs=env_outcome_reward, args=args,
                            train_dataset=dataset)
    mix_in_references(trainer, dataset)
    timer = StepTimer()
    trainer.add_callback(timer)
    totals = defaultdict(float)
    for name in pieces:
        timed(trainer, name, totals)
    if scorer_attr:
        setattr(trainer, scorer_attr, TimedScorer(getattr(trainer, scorer_attr), totals))
    trainer.train()
    return statistics.median(timer.times[2:]), {k: v / len(timer.times) for k, v in totals.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = make_dataset("multi_countdown", 2, 64, seed=0)

    from ppm_trl.trainers.papo import PAPOTrainer
    from ppm_trl.trainers.ppm import PPMGRPOTrainer

    results = {}
    grpo_step, _ = run(GRPOTrainer, GRPOConfig, args.steps, dataset)
    results["grpo_step_s"] = grpo_step

    ppm_pieces = ["_prefix_lengths", "_segment_advantages", "_segment_ids", "_log_ppm"]
    ppm_step, ppm_totals = run(PPMGRPOTrainer, PPMConfig, args.steps, dataset, pieces=ppm_pieces,
                               scorer_attr="progress_scorer", filter_zero_advantage_groups=False)
    ppm_math = sum(ppm_totals[n] for n in ppm_pieces)
    results.update(ppm_step_s=ppm_step, ppm_vs_grpo=ppm_step / grpo_step, ppm_math_s=ppm_math,
                   ppm_math_fraction_of_step=ppm_math / ppm_step, ppm_scorer_s=ppm_totals["scorer"])

    papo_step, papo_totals = run(PAPOTrainer, PAPOConfig, args.steps, dataset, scorer_attr="process_scorer")
    papo_without_judge = papo_step - papo_totals["scorer"]
    results.update(papo_step_s=papo_step, papo_scorer_s=papo_totals["scorer"],
                   papo_without_judge_vs_grpo=papo_without_judge / grpo_step)

    print(json.dumps(results, indent=1))
    print(f"PPM step / GRPO step: {results['ppm_vs_grpo']:.3f}; PPM advantage+segmentation = "
          f"{100 * results['ppm_math_fraction_of_step']:.2f}% of a PPM step (target < 2%)")
    print(f"PAPO step without judge / GRPO step: {results['papo_without_judge_vs_grpo']:.3f} (target <= 1.02)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
