"""OPSD, the PPM paper's baseline (App. B.1, eq. 111; issue 43 item 4): the per-token generalized JSD between a fixed
teacher (the starting policy given the reference) and the policy on its own rollouts. Hand-computed: the divergence
on two-token distributions, and one real training step whose loss is recomputed here from independent forwards."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import build_trainer, script_generation

from ppm_trl.opsd.divergence import sequence_mean, token_jsd


def _logits(probabilities):
    return torch.log(torch.tensor(probabilities, dtype=torch.float64)).reshape(1, 1, -1)


def test_the_divergence_is_the_generalized_jsd():
    student, teacher = [0.5, 0.5], [0.9, 0.1]
    mixture = [0.7, 0.3]
    kl = lambda p, q: sum(a * math.log(a / b) for a, b in zip(p, q))  # noqa: E731
    expected = 0.5 * kl(teacher, mixture) + 0.5 * kl(student, mixture)
    assert token_jsd(_logits(student), _logits(teacher)).item() == pytest.approx(expected, rel=1e-12)
    assert token_jsd(_logits(teacher), _logits(student)).item() == pytest.approx(expected, rel=1e-12)  # symmetric
    assert token_jsd(_logits(teacher), _logits(teacher)).item() == pytest.approx(0.0, abs=1e-15)
    skewed = [0.25 * a + 0.75 * b for a, b in zip(teacher, student)]  # β = 0.25: M = βT + (1 − β)S
    assert token_jsd(_logits(student), _logits(teacher), beta=0.25).item() == pytest.approx(
        0.25 * kl(teacher, skewed) + 0.75 * kl(student, skewed), rel=1e-12)
    far = token_jsd(_logits([1 - 1e-12, 1e-12]), _logits([1e-12, 1 - 1e-12])).item()
    assert far == pytest.approx(math.log(2), rel=1e-6)  # bounded by ln 2
    for beta in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="beta must be in"):
            token_jsd(_logits(student), _logits(teacher), beta=beta)


def test_each_row_is_averaged_over_its_own_tokens():
    per_token = torch.tensor([[1.0, 2.0, 9.0], [4.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert sequence_mean(per_token, mask).tolist() == [1.5, 4.0, 0.0]


@pytest.mark.parametrize("settings, says", [
    ({"opsd_beta": 1.0}, "opsd_beta must be in"),
    ({"opsd_teacher_template": "{problem} only"}, "must contain \\['{reference}'\\]"),
    ({"beta": 0.04}, "`beta=0.04` adds a term to that loss and would be ignored. Leave `beta=0.0`"),
    ({"entropy_coef": 0.1}, "`entropy_coef=0.1` adds a term"),
    ({"entropy_coef": 0.01, "use_adaptive_entropy": True}, "`entropy_coef=0.01`, `use_adaptive_entropy=True` adds"),
])
def test_bad_settings_are_refused(tmp_path, settings, says):
    from ppm_trl.opsd.opsd_config import OPSDConfig

    with pytest.raises(ValueError, match=says):
        OPSDConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **settings)


def test_one_step_loss_is_the_jsd_to_the_fixed_teacher_given_the_reference(tmp_path):
    from ppm_trl.text import problem_text
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    trainer = build_trainer("opsd", tmp_path, max_steps=2, num_generations=4, per_device_train_batch_size=4,
                            max_completion_length=24, learning_rate=1e-2)
    tokenizer = trainer.tokenizer
    script_generation(trainer, lambda prompt, index: ["1+1=2", "I do not know", "a:3", "ok"][index % 4])
    start, _ = build_tiny_model_and_tokenizer()  # the starting weights, built again: the teacher must keep them
    rows = {problem_text(row): row for row in trainer.train_dataset}
    seen = []
    compute = trainer.method_loss

    def spy(model, inputs):
        loss = compute(model, inputs)
        expected = []
        with torch.no_grad():
            for i in range(inputs["completion_ids"].shape[0]):
                prompt = inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()
                completion = inputs["completion_ids"][i][inputs["completion_mask"][i].bool()].tolist()
                row = rows[problem_text({"prompt": [{"role": "user",
                                                     "content": _user_turn(tokenizer.decode(prompt))}]})]
                teacher_text = trainer.args.opsd_teacher_template.format(problem=problem_text(row),
                                                                         reference=row["reference"])
                teacher_prompt = tokenizer(tokenizer.apply_chat_template(
                    [{"role": "user", "content": teacher_text}], tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"]
                student_logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
                teacher_logits = start(torch.tensor([teacher_prompt + completion])).logits[0, len(teacher_prompt) - 1 : -1]
                expected.append(token_jsd(student_logits[None].double(), teacher_logits[None].double())[0].mean())
        seen.append((loss.item(), torch.stack(expected).mean().item()))
        return loss

    trainer.method_loss = spy
    trainer.train()
    assert len(seen) == 2
    for loss, expected in seen:
        assert loss == pytest.approx(expected, rel=2e-3) and loss > 0  # float32 logits in the trainer
    assert seen[0][0] != pytest.approx(seen[1][0], rel=1e-6)  # the student moved between the steps
    for (name, taught), (_, original) in zip(trainer.teacher_model.named_parameters(), start.named_parameters()):
        assert torch.equal(taught, original), name  # the teacher stayed the starting policy
    logged = [entry["opsd/jsd"] for entry in trainer.state.log_history if "opsd/jsd" in entry]
    assert logged == pytest.approx([loss for loss, _ in seen], rel=1e-5)


def _user_turn(decoded_prompt: str) -> str:
    """The user message inside a decoded chat prompt (the tiny model's Qwen-style template)."""
    return decoded_prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def test_the_card_cites_the_ppm_paper_that_defines_opsd():
    """OPSD's folder writes its citation itself (no import of another method's folder); it must stay PPM's."""
    from ppm_trl.opsd import PAPER
    from ppm_trl.ppm import PAPER as PPM_PAPER
    from ppm_trl.registry import get_method

    assert PAPER == PPM_PAPER and get_method("opsd").paper == PPM_PAPER
