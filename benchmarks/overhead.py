"""Per-step overhead of PPMGRPOTrainer / PAPOTrainer / ARGTrainer against plain GRPOTrainer, in the same run.

Every trainer trains the same tiny model from the same seed on the same synthetic batch shape (real HF generation
on CPU). Besides whole-step ratios (which include the partial-credit scorer: the programmatic matcher here, an LLM
judge in real runs), the method-specific work is timed by wrapping the trainer's own pieces:

* PPM: prefix lengths + segmentation + segment advantages + token expansion + metrics — the issue's "< 2% of a
  training step" target — and, separately, the progress scorer (judge latency in real runs).
* PAPO: everything PAPO adds except the process scorer (judge latency excluded) — target ≤ 2% of a GRPO step.
* ARG: the extra time per step on a task the model always fails, against the time plain generation takes for the
  same number of extra sequences (target ≤ 1.2×).

    python benchmarks/overhead.py [--steps 12] [--repeats 3] [--json out.json]
    python benchmarks/overhead.py --quick      # CI smoke
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

from ppm_trl.envs import make_dataset  # noqa: E402
from ppm_trl.papo.papo_config import PAPOConfig
from ppm_trl.ppm.ppm_config import PPMConfig
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


class ReplayedBatch:
    """The same completions for every trainer: sampled once from the tiny model (real HF generation), with every
    other one replaced by its reference solution so groups are mixed (the scorers and judges have correct responses
    and progress to grade). Replaying them makes the forward/backward work identical across trainers, so a step
    ratio measures the method's own overhead; generation, which would dilute it, costs nothing here."""

    def __init__(self, dataset):
        self.references = {row["prompt"][0]["content"]: row["reference"] for row in dataset}
        self.cache = {}

    def install(self, trainer):
        tokenizer = trainer.processing_class
        hook = generation_hook(trainer)
        generate = getattr(trainer, hook)

        def replay(prompt_ids, *args, **kwargs):
            key = tuple(map(tuple, prompt_ids))
            if key not in self.cache:
                completion_ids, _ = generate(prompt_ids, *args, **kwargs)
                for i in range(0, len(completion_ids), 2):
                    prompt = tokenizer.decode(prompt_ids[i])
                    reference = next(r for p, r in self.references.items() if p in prompt)
                    completion_ids[i] = tokenizer(reference, add_special_tokens=False)["input_ids"] + [
                        tokenizer.eos_token_id]
                self.cache[key] = completion_ids
            return [list(ids) for ids in self.cache[key]], None

        setattr(trainer, hook, replay)


def generation_hook(trainer) -> str:
    """The method the generation backend is reached through: our trainers' public `sample_completion_ids` (ARG's
    continuations go through it too), else TRL's own `_generate_single_turn` (the plain GRPOTrainer baseline)."""
    return "sample_completion_ids" if hasattr(trainer, "sample_completion_ids") else "_generate_single_turn"


def run(trainer_class, config_class, steps, dataset, pieces=(), scorer_attr=None, replay=None,
        reward_funcs=env_outcome_reward, keep_trainer=False, setup=None, **extra):
    """Median step time after 2 warm-up steps, and the mean per-step time of each wrapped piece."""
    model, tokenizer = build_tiny_model_and_tokenizer(seed=0, hidden_size=64, num_hidden_layers=2)
    args = config_class(output_dir=tempfile.mkdtemp(), max_steps=steps, **{**COMMON, **extra})
    trainer = trainer_class(model=model, processing_class=tokenizer, reward_funcs=reward_funcs, args=args,
                            train_dataset=dataset)
    if replay is not None:
        replay.install(trainer)
    timer = StepTimer()
    trainer.add_callback(timer)
    totals = defaultdict(float)
    for name in pieces:
        timed(trainer, name, totals)
    if scorer_attr:
        setattr(trainer, scorer_attr, TimedScorer(getattr(trainer, scorer_attr), totals))
    if setup is not None:
        setup(trainer)
    trainer.train()
    result = statistics.median(timer.times[2:]), {k: v / len(timer.times) for k, v in totals.items()}
    return (*result, trainer) if keep_trainer else result


def arg_overhead(steps: int) -> dict:
    """ARG on a task the tiny model always fails (every group is an all-failure group): the time ARG adds per step
    (`_guide_failed_groups`: early verification, surprisal forward, the continuation call, verification, selector)
    against plain generation of the same number of extra sequences with the same budget."""
    from ppm_trl.arg.arg_config import ARGConfig
    from ppm_trl.arg.arg_trainer import ARGTrainer
    from ppm_trl.rewards import accuracy_reward, format_reward

    dataset = make_dataset("chain", 3, 64, seed=0)
    sizes = []

    def count_generation_rows(trainer):
        generate = trainer.sample_completion_ids

        def counting(prompt_ids, *args, **kwargs):
            sizes.append(len(prompt_ids))
            return generate(prompt_ids, *args, **kwargs)

        trainer.sample_completion_ids = counting

    step, totals, trainer = run(ARGTrainer, ARGConfig, steps, dataset, pieces=["_guide_failed_groups"],
                                reward_funcs=[accuracy_reward, format_reward], keep_trainer=True,
                                setup=count_generation_rows, reward_weights=[1.0, 0.2], warmup_steps=0)
    generate = type(trainer).sample_completion_ids.__get__(trainer)
    extra_rows = statistics.median(sizes[1::2])  # calls alternate: the group's G samples, then the continuations
    tokenizer = trainer.processing_class
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
             for row in dataset.select(range(int(extra_rows)))]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    plain = []
    for _ in range(3):
        start = time.perf_counter()
        generate(prompts, None, {}, 1)
        plain.append(time.perf_counter() - start)
    guide = totals["_guide_failed_groups"]
    return {"arg_step_s": step, "arg_extra_s": guide, "arg_extra_rows": extra_rows,
            "plain_generation_same_rows_s": statistics.median(plain),
            "arg_extra_vs_plain_generation": guide / statistics.median(plain)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="CI smoke: 3 steps, 1 repeat (timings meaningless).")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 3, 1
    torch.set_num_threads(1)
    dataset = make_dataset("multi_countdown", 2, 64, seed=0)

    from ppm_trl.papo.papo_trainer import PAPOTrainer
    from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer

    results = defaultdict(list)
    replay = ReplayedBatch(dataset)
    # `_score_progress` decodes the K prefixes and calls the scorer; the scorer's own time is subtracted below.
    ppm_pieces = ["_prefix_lengths", "_score_progress", "_segment_advantages", "_segment_ids", "_log_ppm"]
    # With overlap off, `compute_advantages` also calls `_score` (the scorer; its own time subtracted below).
    papo_pieces = ["compute_advantages"]

    def grpo():
        return {"grpo": run(GRPOTrainer, GRPOConfig, args.steps, dataset, replay=replay)}

    def ppm():
        return {"ppm": run(PPMGRPOTrainer, PPMConfig, args.steps, dataset, replay=replay, pieces=ppm_pieces,
                           scorer_attr="progress_scorer", filter_zero_advantage_groups=False,
                           learning_rate=COMMON["learning_rate"], epsilon_high=None,
                           overlap_scoring=False)}  # the pieces are timed on the training thread (judge_overlap.py: overlap)

    def papo():
        return {"papo": run(PAPOTrainer, PAPOConfig, args.steps, dataset, replay=replay, pieces=papo_pieces,
                            scorer_attr="process_scorer", overlap_scoring=False)}  # timed on the training thread

    grpo()  # untimed: fills the replay cache (the real generation happens here, once)
    order = [grpo, ppm, papo]
    for repeat in range(args.repeats):  # interleaved and rotated, so load drift and warm-up hit every trainer alike
        measured = {}
        for bench in order[repeat % 3:] + order[: repeat % 3]:
            measured.update(bench())
        (grpo_step, _), (ppm_step, ppm_totals), (papo_step, papo_totals) = (
            measured["grpo"], measured["ppm"], measured["papo"])
        ppm_math = sum(ppm_totals[n] for n in ppm_pieces) - ppm_totals["scorer"]
        results["grpo_step_s"].append(grpo_step)
        results["ppm_vs_grpo"].append(ppm_step / grpo_step)
        results["ppm_without_scorer_vs_grpo"].append((ppm_step - ppm_totals["scorer"]) / grpo_step)
        results["ppm_math_fraction_of_step"].append(ppm_math / ppm_step)
        results["ppm_scorer_s"].append(ppm_totals["scorer"])
        results["papo_without_judge_vs_grpo"].append((papo_step - papo_totals["scorer"]) / grpo_step)
        results["papo_scorer_s"].append(papo_totals["scorer"])
        papo_math = sum(papo_totals[n] for n in papo_pieces) - papo_totals["scorer"]
        results["papo_math_fraction_of_grpo_step"].append(papo_math / grpo_step)
        for key, value in arg_overhead(args.steps).items():
            results[key].append(value)
    results = {key: statistics.median(values) for key, values in results.items()}
    print(json.dumps(results, indent=1))
    print(f"PPM step / GRPO step: {results['ppm_vs_grpo']:.3f} (without the programmatic scorer "
          f"{results['ppm_without_scorer_vs_grpo']:.3f}); PPM advantage+segmentation = "
          f"{100 * results['ppm_math_fraction_of_step']:.2f}% of a PPM step (target < 2%)")
    print(f"PAPO step without judge / GRPO step: {results['papo_without_judge_vs_grpo']:.3f} (target <= 1.02); "
          f"PAPO's own work without the judge = {100 * results['papo_math_fraction_of_grpo_step']:.2f}% of a GRPO step")
    print(f"ARG extra time / plain generation of the same {results['arg_extra_rows']:.0f} sequences: "
          f"{results['arg_extra_vs_plain_generation']:.3f} (target <= 1.2)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
