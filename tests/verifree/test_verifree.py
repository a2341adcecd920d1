"""VeriFree, the PPM paper's baseline (App. B.1, eq. 110; issue 43 item 4): reward = outcome + exp of the mean
log-likelihood of the reference's final output after the rollout's reasoning, its own final output discarded.
Hand-computed: the cut, the reference answer, exp(mean), and one real training step whose advantages are
recomputed here from an independent forward of the tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import build_trainer, script_generation

from ppm_trl.verifree.likelihood import likelihood_reward, reference_final_output, split_rollout


@pytest.mark.parametrize("text, reasoning, found", [
    ("<think>3 + 4 = 7</think>The answer is \\boxed{7}.", "<think>3 + 4 = 7</think>", True),
    ("3 + 4 = 7\nSo the answer is \\boxed{7}.", "3 + 4 = 7\nSo the answer is ", True),
    ("\\boxed{1}, then \\boxed{2}", "\\boxed{1}, then ", True),  # the last box is the final output
    ("3 + 4 = 7, I think", "3 + 4 = 7, I think", False),  # no final output: all reasoning
    ("", "", False),
])
def test_the_rollouts_final_output_is_cut_off(text, reasoning, found):
    assert split_rollout(text) == (reasoning, found)


def test_the_reference_answer_is_the_references_own_final_output():
    assert reference_final_output("We add: $3 + 4 = 7$, so $\\boxed{7}$.", "7") == "\\boxed{7}$."
    assert reference_final_output("<think>add</think>\nThe answer is \\boxed{7}", "7") == "The answer is \\boxed{7}"
    assert reference_final_output("We add and get seven.", "7") == "\\boxed{7}"  # none: the gold answer, boxed
    assert reference_final_output("It is \\boxed{a=3, b=9}", None) == "\\boxed{a=3, b=9}"
    with pytest.raises(ValueError, match="no final output"):
        reference_final_output("We add and get seven.", None)


def test_the_reward_is_exp_of_the_mean_log_likelihood():
    logps = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.9), -50.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]])
    reward = likelihood_reward(logps, mask)
    assert reward[0].item() == pytest.approx(math.sqrt(0.5 * 0.25))  # geometric mean of the token probabilities
    assert reward[1].item() == pytest.approx(0.9)  # the padded token is not read
    assert math.isnan(reward[2].item())


def _expected_likelihood(model, tokenizer, prompt_ids, text, reference, answer):
    """exp(mean log p) of the reference's final output after the rollout's reasoning: one plain forward."""
    reasoning, _ = split_rollout(text)
    context = list(prompt_ids) + tokenizer(reasoning, add_special_tokens=False)["input_ids"]
    target = tokenizer(reference_final_output(reference, answer), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([context + target])).logits[0].double()
    logps = torch.log_softmax(logits, dim=-1)
    token_logps = [logps[len(context) + j - 1, token].item() for j, token in enumerate(target)]
    return math.exp(sum(token_logps) / len(token_logps))


def test_one_step_advantages_are_group_normalised_outcome_plus_likelihood(tmp_path):
    trainer = build_trainer("verifree", tmp_path, max_steps=1, num_generations=4, per_device_train_batch_size=4,
                            max_completion_length=48, verifree_weight=0.5)
    # Two rollouts of a group share their reasoning and differ only in the final output: VeriFree must not see it.
    texts = ["I try 1 + 2.\n\\boxed{3}", "I try 1 + 2.\n\\boxed{999}", "No idea.", "Lines.\n\\boxed{1}"]
    script_generation(trainer, lambda prompt, index: texts[index % 4])
    seen = []
    compute = trainer.compute_advantages

    def spy(batch):
        result = compute(batch)
        rollout = trainer.current_rollout
        expected = [_expected_likelihood(trainer.model, trainer.tokenizer, rollout.prompt_ids[i],
                                         batch.completions[i] if isinstance(batch.completions[i], str)
                                         else batch.completions[i][0]["content"], row["reference"], row.get("answer"))
                    for i, row in enumerate(batch.rows)]
        seen.append((batch.outcome.clone(), expected, result.values.clone()))
        return result

    trainer.compute_advantages = spy
    trainer.train()
    outcome, likelihood, advantages = seen[0]
    likelihood = torch.tensor(likelihood, dtype=torch.float64)
    assert likelihood[0].item() == pytest.approx(likelihood[1].item(), rel=1e-9)  # the final output is discarded
    reward = (outcome.double() + 0.5 * likelihood).reshape(-1, 4)
    centred = reward - reward.mean(dim=1, keepdim=True)
    expected = centred / (reward.std(dim=1, keepdim=True) + 1e-4)  # TRL's scale_rewards="group", sample std
    assert torch.allclose(advantages.double(), expected.reshape(-1), rtol=1e-3, atol=1e-6), (advantages, expected)
    assert advantages.abs().sum() > 0  # the likelihood alone separates rollouts no verifier would
    logged = trainer.state.log_history[0]
    assert logged["verifree/final_output_found"] == pytest.approx(0.75)
    assert logged["verifree/reference_likelihood"] == pytest.approx(likelihood.mean().item(), rel=1e-5)
