"""Issue 25 item 3: stateless hooks. The advantage hook gets one `ScoredBatch` (local rows, gathered rewards and
outcome, masks, this process's slice, the pending work `on_final_rollout` returned); the method trainers keep no
per-batch state on `self`; the removed `on_scores` hook and the old `compute_advantages` signature are refused; a
composed trainer checks its reward columns and resolves its model once."""

from __future__ import annotations

import dataclasses
import re
from concurrent.futures import Future

import pytest
import torch
from datasets import Dataset
from helpers import TINY_ARGS, build_trainer, script_generation

import ppm_trl.registry
import ppm_trl.trainers.base
from ppm_trl.composed import PAPOARGConfig, PAPOARGTrainer, PPMARGConfig, PPMARGTrainer
from ppm_trl.envs import make_dataset
from ppm_trl.ppm.ppm_config import PPMConfig
from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer
from ppm_trl.rewards import accuracy_reward, env_outcome_reward, format_reward
from ppm_trl.tiny import build_tiny_model_and_tokenizer
from ppm_trl.trainers.base import ScoredBatch
from ppm_trl.trainers.common import weighted_outcome

G = 4
SETTINGS = dict(per_device_train_batch_size=8, num_generations=G, max_completion_length=64, max_steps=2,
                learning_rate=1e-3, **TINY_ARGS)


def _completions(dataset):
    """Two prompts: all correct (different texts) and two correct, two wrong — PAPO judges the correct ones."""
    references = [row["reference"] for row in dataset]
    prompts = [row["prompt"][0]["content"] for row in dataset]

    def completion_for(prompt_text, index):
        row = next(i for i, prompt in enumerate(prompts) if prompt in prompt_text)
        reference = references[row]
        mixes = [[reference, "Solution:\n" + reference, reference + "\nDone", "So:\n" + reference],
                 [reference, "nope", "Solution:\n" + reference, "no"]]
        return mixes[row % 2][index % G]

    return completion_for


def _trainer(method, tmp_path, overlap):
    settings = dict(num_segments=4) if method == "ppm" else {}
    scorer = None if method == "ppm" else lambda rows, texts: [(1.0, 0.5, 0.0)[len(t) % 3] for t in texts]
    trainer = build_trainer(method, tmp_path, scorer=scorer, overlap_scoring=overlap, **settings, **SETTINGS)
    script_generation(trainer, _completions(trainer.train_dataset))
    return trainer


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("method", ["ppm", "papo"])
def test_the_advantage_hook_gets_one_batch_and_nothing_stays_on_the_trainer(tmp_path, method, overlap):
    trainer = _trainer(method, tmp_path, overlap)
    returned, batches = [], []
    start, advantages = trainer.on_final_rollout, trainer.compute_advantages

    def on_final_rollout(rollout):
        returned.append(start(rollout))
        return returned[-1]

    def compute_advantages(batch):
        batches.append(batch)
        return advantages(batch)

    trainer.on_final_rollout, trainer.compute_advantages = on_final_rollout, compute_advantages
    trainer.train()
    assert len(batches) == len(returned) == 2
    for batch, pending in zip(batches, returned):
        assert isinstance(batch, ScoredBatch)
        rows = len(batch.rows)
        assert rows == len(batch.completions) == len(batch.completion_ids) == batch.completion_mask.shape[0] == 8
        assert batch.local == slice(0, rows)  # one process: all of the gathered batch
        assert batch.rewards_per_func.shape == (rows, 1)
        expected = weighted_outcome(batch.rewards_per_func, trainer.outcome_reward_weights)
        assert torch.equal(batch.outcome.nan_to_num(-7.0), expected.nan_to_num(-7.0))
        assert batch.pending is pending  # what on_final_rollout returned, handed over as is
        if overlap:  # a frozen dataclass of the method's, its pending work by name
            assert dataclasses.is_dataclass(pending) and type(pending).__dataclass_params__.frozen
            work = pending.progress if method == "ppm" else pending.scores
            assert isinstance(work, (Future, list))
        else:
            assert pending is None
        with pytest.raises(dataclasses.FrozenInstanceError):
            batch.outcome = None
    # Per-batch state lives in the batch only: the one attribute left is the base's cross-step counter snapshot.
    method_state = {name for name in vars(trainer) if name.startswith(f"_{method}")}
    assert method_state == set() and isinstance(trainer._scorer_counts_seen, dict)
    assert trainer._pending is None and trainer._rewarded is None  # the base drops the batch with its step


def test_the_removed_hook_and_the_old_signature_are_refused_with_the_fix(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=0)
    args = PPMConfig(output_dir=str(tmp_path), num_segments=4, **SETTINGS)

    class OldScores(PPMGRPOTrainer):
        def on_scores(self, rows, completions, completion_ids, rewards_per_func):
            pass

    class OldSignature(PPMGRPOTrainer):
        def compute_advantages(self, completion_mask, tool_mask):
            return None

    class OldSignatureBelow(OldSignature):  # inherited from a parent, not written in the class itself
        pass

    for cls, message in [(OldScores, r"OldScores\.on_scores: this hook is gone"),
                         (OldSignature, r"OldSignature\.compute_advantages must take one argument, the ScoredBatch"),
                         (OldSignatureBelow, r"OldSignatureBelow\.compute_advantages must take one argument")]:
        with pytest.raises(TypeError, match=message):  # refused before any model is looked at
            cls(model="never-loaded", reward_funcs=env_outcome_reward, args=args, train_dataset=dataset)

    class NewSignature(PPMGRPOTrainer):
        def compute_advantages(self, batch, *extra):
            return super().compute_advantages(batch)

    model, tokenizer = build_tiny_model_and_tokenizer()
    NewSignature(model=model, processing_class=tokenizer, reward_funcs=env_outcome_reward, args=args,
                 train_dataset=dataset)


def _reference_dataset(with_answer=True):
    data = {"prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(4)],
            "reference": [f"{i} + 1 = {i + 1}, so \\boxed{{{i + 1}}}" for i in range(4)],
            "reasoning_points": [[f"{i} + 1 = {i + 1}"] for i in range(4)]}
    if with_answer:
        data["answer"] = [str(i + 1) for i in range(4)]
    return Dataset.from_dict(data)


@pytest.mark.parametrize("trainer_class, config_class, label", [(PPMARGTrainer, PPMARGConfig, "PPM+ARG"),
                                                                (PAPOARGTrainer, PAPOARGConfig, "PAPO+ARG")])
def test_a_composed_trainer_checks_its_rewards_and_resolves_its_model_once(tmp_path, monkeypatch, trainer_class,
                                                                           config_class, label):
    looked_up, resolved = [], []
    lookup, resolve = ppm_trl.registry.reward_of_function, ppm_trl.trainers.base.method_trainer.resolve_model_path
    monkeypatch.setattr(ppm_trl.registry, "reward_of_function", lambda f: looked_up.append(f) or lookup(f))
    monkeypatch.setattr(ppm_trl.trainers.base.method_trainer, "resolve_model_path",
                        lambda model, args: resolved.append(model) or resolve(model, args))
    scorer = "progress_scorer" if trainer_class is PPMARGTrainer else "process_scorer"
    extra = {scorer: "judge", "judge_model": "openai/never-called", "judge_probe": False}
    args = config_class(output_dir=str(tmp_path), arg_max_accepted=2, **{**SETTINGS, **extra})
    funcs = [accuracy_reward, format_reward]
    trainer_class(model="tiny", reward_funcs=funcs, args=args, train_dataset=_reference_dataset())
    assert looked_up == funcs and resolved == ["tiny"]  # once each, not once per composed method
    looked_up.clear()
    with pytest.raises(ValueError, match=rf"^{re.escape(label)} with the `accuracy_reward` reward needs the `answer` column"):
        trainer_class(model="tiny", reward_funcs=funcs, args=args, train_dataset=_reference_dataset(False))
    assert looked_up == [accuracy_reward]  # the one error, before a second check of the same columns


@pytest.mark.parametrize("trainer_class, prefix, keys", [
    ("PPMGRPOTrainer", "ppm/scorer_", ("requests", "skipped_empty", "skipped_unchanged", "deduplicated", "failures")),
    ("PAPOTrainer", "papo/judge_", ("requests", "failures"))])
def test_the_scorer_counts_are_each_steps_increase_summed_over_the_processes(trainer_class, prefix, keys):
    """One rule for PPM and PAPO (`ScoredMethodTrainer.log_scorer_counts`): the counters' increase since the last
    log, gathered and summed — with two processes, rank 0's share alone would be logged otherwise."""
    import types

    import ppm_trl

    cls = getattr(ppm_trl, trainer_class)
    trainer = object.__new__(cls)
    setattr(trainer, cls.scorer_attribute, types.SimpleNamespace(stats={"requests": 7, "failures": 1}))
    trainer._scorer_counts_seen = {"requests": 3}
    other_process = 10.0  # what the other rank's counter grew by
    trainer.accelerator = types.SimpleNamespace(device="cpu", gather=lambda x: torch.stack([x, x + other_process]))
    logged = {}
    trainer.log_metric = logged.__setitem__
    trainer.log_scorer_counts()
    assert cls.scorer_counts == (prefix, keys)
    expected = {"requests": 4 + 14, "failures": 1 + 11}
    assert logged == {f"{prefix}{key}": expected.get(key, 0 + other_process) for key in keys}
    assert trainer._scorer_counts_seen == {"requests": 7, "failures": 1}
    trainer.log_scorer_counts()  # nothing new on this process: the other's increase alone
    assert logged[f"{prefix}requests"] == other_process
