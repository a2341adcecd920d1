"""ARG + PPM and ARG + PAPO: guidance rewrites the all-failure groups, then the crediting method's advantages are
computed on the final rows (inserted ones included), by hand here."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from helpers import TINY_ARGS, build_trainer, capture_outputs, script_generation

from ppm_trl.composed import PAPOARGConfig, PPMARGConfig, PPMARGTrainer
from ppm_trl.rewards import accuracy_reward
from ppm_trl.tiny import build_tiny_model_and_tokenizer

G, K_CONT, BUDGET, SEGMENTS = 4, 3, 48, 4
# Byte-level tokenizer: one token per character; 31 characters + EOS = 32 tokens, segments of 12 tokens.
REFERENCE = "Add them.\nSo $3+4=7$.\n\\boxed{7}"


def _dataset(n=2):
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"What is 3+4? (#{i})"}] for i in range(n)],
        "answer": ["7"] * n,
        "reference": [REFERENCE] * n,
        "reasoning_points": [["So 3+4=7", "7"]] * n,
    })


def _settings(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=G,
                    max_completion_length=BUDGET, max_steps=1, arg_num_continuations=K_CONT, arg_max_accepted=2,
                    arg_min_continuation_tokens=16, learning_rate=1e-3, warmup_steps=0, **TINY_ARGS)
    return {**settings, **overrides}


def _trainer(method, tmp_path, scorer, **overrides):
    return build_trainer(method, scorer=scorer, reward_funcs=[accuracy_reward], train_dataset=_dataset(),
                         **_settings(tmp_path, **overrides))  # output_dir among the settings


def _rows(out):
    return [out["completion_ids"][i][: int(out["completion_mask"][i].sum())].tolist()
            for i in range(out["completion_ids"].shape[0])]


def test_ppm_arg_credits_the_inserted_reference_with_segment_progress(tmp_path):
    progress_calls = []

    def progress(rows, texts):  # m_k: 1/2 once "So $3+4=7$" is in the prefix, 1 once the boxed answer is
        progress_calls.append([t[-1] for t in texts])
        return torch.tensor([[1.0 if "\\boxed{7}" in p else 0.5 if "So $3+4=7$" in p else 0.0 for p in t]
                             for t in texts])

    trainer = _trainer("ppm+arg", tmp_path, progress, num_segments=SEGMENTS)
    calls = script_generation(trainer, lambda prompt, index: "no idea" if len(calls) == 1 else "Guess \\boxed{8}")
    outputs = capture_outputs(trainer)
    trainer.train()

    assert calls == [8, 2 * K_CONT]  # the groups, then all continuations in one call (through the same hook)
    assert len(progress_calls) == 1  # guidance's verification never asks the progress scorer
    tokenizer = trainer.processing_class
    reference = tokenizer(REFERENCE, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    rows, adv, mask = _rows(outputs[0]), outputs[0]["advantages"], outputs[0]["completion_mask"].bool()
    assert adv.shape == outputs[0]["completion_ids"].shape  # PPM's (B, T), not ARG's (B,)
    # Per group: 3 × "no idea" (8 tokens, segment 1 only: r = [0, 0, 0, 0]) and the reference fallback once:
    # prefixes end at 12, 24, 36 tokens → m = [0, 1/2, 1] (segment 4 empty), r = [0, 1/2, 1/2] + outcome 1.
    # Segment means [1/4, 3/8, 3/8, 0] → reference [3/4, 9/8, 9/8], failures −1/4 on their only segment.
    for group in range(2):
        members = range(group * G, (group + 1) * G)
        inserted = [i for i in members if rows[i] == reference]
        assert len(inserted) == 1
        for i in members:
            tokens = adv[i][mask[i]]
            if i in inserted:
                assert torch.allclose(tokens[:12], torch.full((12,), 0.75)), tokens
                assert torch.allclose(tokens[12:], torch.full((20,), 1.125)), tokens
            else:
                assert tokens.numel() == 8 and torch.allclose(tokens, torch.full((8,), -0.25)), tokens
    assert sum(REFERENCE in text for text in progress_calls[0]) == 2  # the inserted rows were judged too
    logs = trainer.state.log_history[0]
    assert logs["arg/fallback_groups"] == 2 and logs["arg/inserted_rows"] == 2
    assert logs["ppm/final_progress"] == pytest.approx(2 / 8)


def test_papo_arg_normalises_process_scores_over_the_correct_rows_after_insertion(tmp_path):
    judged = []

    def process(rows, texts):  # the first correct row of each prompt scores 1, the next 0
        seen, scores = set(), []
        for row in rows:
            key = row["prompt"][0]["content"]
            scores.append(0.0 if key in seen else 1.0)
            seen.add(key)
        judged.append(list(texts))
        return scores

    trainer = _trainer("papo+arg", tmp_path, process, arg_mode="resampling")
    calls = script_generation(trainer, lambda prompt, index: "no idea" if len(calls) == 1 else "Guess \\boxed{7}")
    outputs = capture_outputs(trainer)
    trainer.train()

    assert calls == [8, 2 * K_CONT]
    assert len(judged) == 1 and len(judged[0]) == 4  # only the final correct rows, 2 per group
    tokenizer = trainer.processing_class
    guess = tokenizer("Guess \\boxed{7}", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    rows, adv = _rows(outputs[0]), outputs[0]["advantages"].double()
    assert adv.dim() == 1
    # Per group: 2 failures + 2 accepted continuations (resampling: empty prefix, cap 2). A_out over [1, 1, 0, 0]:
    # mean 1/2, sample std sqrt(1/3) → ±0.5/(sqrt(1/3) + 1e-6). A_proc over the correct rows [1, 0]: mean 1/2,
    # sample std sqrt(1/2) → ±0.5/(sqrt(1/2) + 1e-6); incorrect rows 0.
    a_out = 0.5 / (3 ** -0.5 + 1e-6)
    a_proc = 0.5 / (0.5 ** 0.5 + 1e-6)
    for group in range(2):
        members = list(range(group * G, (group + 1) * G))
        correct = [i for i in members if rows[i] == guess]
        assert len(correct) == 2
        expected = {correct[0]: a_out + a_proc, correct[1]: a_out - a_proc}
        for i in members:
            assert adv[i].item() == pytest.approx(expected.get(i, -a_out), abs=1e-5), (i, adv[i])
    assert trainer.state.log_history[0]["arg/groups_with_accepted"] == 2


def test_composed_configs_keep_both_methods_checks(tmp_path):
    with pytest.raises(ValueError, match="arg_max_accepted must lie in"):
        PPMARGConfig(**_settings(tmp_path, arg_max_accepted=G))
    with pytest.raises(ValueError, match="does not support loss_type='vespo'"):
        PPMARGConfig(**_settings(tmp_path, loss_type="vespo"))
    with pytest.raises(ValueError, match="process_norm"):
        PAPOARGConfig(**_settings(tmp_path, process_norm="everything"))
    model, tokenizer = build_tiny_model_and_tokenizer()
    with pytest.raises(ValueError, match="`reasoning_points`"):
        PPMARGTrainer(model=model, processing_class=tokenizer, reward_funcs=[accuracy_reward],
                      args=PPMARGConfig(**_settings(tmp_path)), train_dataset=_dataset().remove_columns(
                          "reasoning_points"))
    with pytest.raises(TypeError, match="needs a PPMARGConfig"):
        PPMARGTrainer(model=model, processing_class=tokenizer, reward_funcs=[accuracy_reward],
                      args=PAPOARGConfig(**_settings(tmp_path)), train_dataset=_dataset())
