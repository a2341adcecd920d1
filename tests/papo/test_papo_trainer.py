"""End-to-end PAPOTrainer on the tiny model with scripted completions."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import build_trainer, capture_outputs, script_generation

from ppm_trl.envs import make_dataset

G = 4


class CountingScorer:
    """A fake judge: scores by a fixed table keyed on the response text; records every text it was asked about."""

    def __init__(self, scores):
        self.scores = scores
        self.seen = []
        self.stats = {}

    def __call__(self, rows, texts):
        self.seen.extend(texts)
        return [self.scores(text) for text in texts]


def _reference_for(dataset, prompt_text):
    return next(r["reference"] for r in dataset if r["prompt"][0]["content"] in prompt_text)


def _trainer(tmp_path, dataset, scorer, **overrides):
    settings = dict(per_device_train_batch_size=4, num_generations=G, max_completion_length=48, max_steps=1)
    return build_trainer("papo", tmp_path, scorer=scorer, train_dataset=dataset, **{**settings, **overrides})


def _run(tmp_path, completions, scores, **overrides):
    dataset = make_dataset("multi_countdown", 1, 1, seed=3)
    reference = dataset[0]["reference"]
    scorer = CountingScorer(scores)
    trainer = _trainer(tmp_path, dataset, scorer, **overrides)
    script_generation(trainer, lambda prompt, index: completions(reference)[index % G])
    outputs = capture_outputs(trainer)
    trainer.train()
    return outputs[0]["advantages"], scorer, reference


def test_all_correct_group_keeps_a_process_signal(tmp_path):
    # Four correct responses (A_out = 0) with rubric scores 1, 1, 0.5, 0 → A_proc ≠ 0.
    def completions(reference):
        return [reference, reference + " ", reference + "  ", reference + "   "]

    scores = {0: 1.0, 1: 1.0, 2: 0.5, 3: 0.0}
    adv, scorer, _ = _run(tmp_path, completions, lambda text: scores[len(text) - len(text.rstrip())])
    # mean 0.625; sample std sqrt(((.375)^2*2 + (.125)^2 + (.625)^2)/3) = sqrt(0.6875/3)
    std = math.sqrt((2 * 0.375**2 + 0.125**2 + 0.625**2) / 3)
    expected = [(s - 0.625) / (std + 1e-6) for s in (1.0, 1.0, 0.5, 0.0)]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-5)
    assert len(scorer.seen) == 4


@pytest.mark.parametrize("overlap", [True, False])  # judged under TRL's log-prob passes, or after its rewards
def test_judge_is_never_called_for_incorrect_responses(tmp_path, overlap):
    def completions(reference):
        return [reference, "wrong", reference + " ", "also wrong"]

    adv, scorer, reference = _run(tmp_path, completions, lambda text: 1.0 if text.endswith(" ") else 0.5,
                                  overlap_scoring=overlap)
    assert sorted(scorer.seen) == sorted([reference, reference + " "])  # two correct → two calls, no more
    # A_out: outcome [1,0,1,0], mean .5, sample std sqrt(1/3): ±0.5/sqrt(1/3) = ±0.8660
    # A_proc over C = {0, 2}: scores .5 and 1 → mean .75, sample std sqrt(.125): ∓/± 0.25/0.35355 = 0.7071
    a_out = 0.5 / math.sqrt(1 / 3)
    a_proc = 0.25 / math.sqrt(0.125)
    assert torch.allclose(adv, torch.tensor([a_out - a_proc, -a_out, a_out + a_proc, -a_out]), atol=1e-4)


def test_one_correct_response_has_no_process_advantage(tmp_path):
    def completions(reference):
        return [reference, "x", "y", "z"]

    adv, scorer, _ = _run(tmp_path, completions, lambda text: 0.0)
    a_out = 0.75 / 0.5  # outcome [1,0,0,0]: mean .25, sample std .5
    assert torch.allclose(adv, torch.tensor([a_out, -0.5, -0.5, -0.5]), atol=1e-4)


@pytest.mark.parametrize("overlap", [True, False])
def test_unparseable_judgement_is_nan_not_zero(tmp_path, overlap):
    def completions(reference):
        return [reference, reference + " ", reference + "  ", "wrong"]

    # The judge fails (None) on the first response: it leaves C's statistics, keeps A_out.
    adv, _, _ = _run(tmp_path, completions, lambda text: None if text == text.rstrip() else float(len(text) % 2),
                     overlap_scoring=overlap)
    a_out_correct = 0.25 / 0.5  # outcome [1,1,1,0]: mean .75, sample std .5
    # C = {1, 2} with scores (len+1)%2 and (len+2)%2 → one 1 and one 0: A_proc = ±0.7071
    assert math.isclose(float(adv[0]), a_out_correct, abs_tol=1e-4)
    assert math.isclose(abs(float(adv[1]) - a_out_correct), 0.5 / math.sqrt(0.5), abs_tol=1e-4)
    assert math.isclose(float(adv[3]), -0.75 / 0.5, abs_tol=1e-4)


def test_scores_outside_unit_interval_are_rejected(tmp_path):
    def completions(reference):
        return [reference] * 4

    with pytest.raises(ValueError, match=r"scores must lie in \[0, 1\]"):
        _run(tmp_path, completions, lambda text: 7.0)


def test_programmatic_scorer_trains(tmp_path):
    dataset = make_dataset("multi_countdown", 2, 2, seed=0)
    trainer = build_trainer("papo", tmp_path, train_dataset=dataset, per_device_train_batch_size=4, num_generations=G,
                            max_completion_length=48, max_steps=2)
    before = [p.detach().clone() for p in trainer.model.parameters()]

    def completion_for(prompt_text, index):
        reference = _reference_for(dataset, prompt_text)
        lines = reference.split("\n")
        # two correct, two wrong (one of them solves problem 1 only)
        return [reference, "Solution:\n" + reference, "nope", lines[0]][index % G]

    script_generation(trainer, completion_for)
    trainer.train()
    logged = trainer.state.log_history[0]
    # Both correct responses reach every point (score 1): two scored correct rows, but equal scores, so A_proc is 0
    # and the process term is inactive (the diagnostic once counted these groups as active).
    assert logged["papo/proc_active_fraction"] == 0.0
    assert logged["papo/correct_fraction"] == 0.5
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_missing_columns_are_named(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=0).remove_columns(["env"])
    with pytest.raises(ValueError, match="`env` column"):
        build_trainer("papo", tmp_path, train_dataset=dataset, per_device_train_batch_size=4, num_generations=G)
    no_reference = make_dataset("multi_countdown", 1, 2, seed=0).remove_columns(["reference"])
    with pytest.raises(ValueError, match="`reference` column"):
        build_trainer("papo", tmp_path, train_dataset=no_reference, per_device_train_batch_size=4, num_generations=G,
                      process_scorer="judge")


@pytest.mark.parametrize("loss_type,extra", [("grpo", {}), ("dr_grpo", {}), ("cispo", {}), ("sapo", {}),
                                             ("bnpo", {}), ("grpo", {"importance_sampling_level": "sequence"})])
def test_every_loss_type_trains(tmp_path, loss_type, extra):
    def completions(reference):
        return [reference, reference + " ", "wrong", reference + "  "]

    adv, _, _ = _run(tmp_path, completions, lambda text: 1.0 - 0.5 * (len(text) - len(text.rstrip())) / 2,
                     loss_type=loss_type, max_steps=2, **extra)
    assert adv.abs().sum() > 0


@pytest.mark.parametrize("change", ["row replaced", "row grown in place"])
def test_early_rewards_check_fires_when_the_ids_change_after_they_were_rewarded(tmp_path, change):
    """`overlap_scoring` rewards the rows at `on_final_rollout` (`compute_rewards_early`); TRL's reward pass then
    reuses those rewards only for the same ids, compared with a copy taken when they were rewarded."""
    dataset = make_dataset("multi_countdown", 1, 1, seed=3)
    trainer = _trainer(tmp_path, dataset, CountingScorer(lambda text: 1.0))
    script_generation(trainer, lambda prompt, index: dataset[0]["reference"] if index % 2 else "nope")
    submit = trainer.on_final_rollout

    def on_final_rollout(rollout):
        pending = submit(rollout)
        ids = rollout.completion_ids
        if change == "row replaced":
            ids[0] = ids[0][:-1]
        else:
            ids[1].append(ids[1][-1])
        return pending

    trainer.on_final_rollout = on_final_rollout
    with pytest.raises(RuntimeError, match="the completions rewarded early are not the ones TRL rewards"):
        trainer.train()
