"""End-to-end ARGTrainer on the tiny model: all-failure groups, reference fallback, accepted continuations, the
selector's feedback and checkpointing (ARG paper §4, Alg. 1, App. E)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from datasets import Dataset
from helpers import TINY_ARGS, capture_outputs, script_generation

from ppm_trl.arg.arg_config import ARGConfig
from ppm_trl.arg.arg_trainer import SELECTOR_STATE_FILE, ARGTrainer
from ppm_trl.arg.selector import PrefixSelector
from ppm_trl.rewards import accuracy_reward, format_reward
from ppm_trl.tiny import build_tiny_model_and_tokenizer

G, K, BUDGET, MIN_CONTINUATION = 4, 3, 48, 16
# Byte-level tokenizer: one token per character. Valid prefix cuts (App. E.2: after a sentence end followed by
# whitespace or after a newline, math closed, a nontrivial suffix holding `\boxed`): 9, 10 — after "So $3+4=7$."
# the suffix would be the answer alone.
REFERENCE = "Add them.\nSo $3+4=7$.\n\\boxed{7}"
CUTS = (9, 10)
ASSISTANT = "<|im_start|>assistant\n"


def _dataset(references=None, n=8):
    references = references or [REFERENCE] * n
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"What is 3+4? (#{i})"}] for i in range(len(references))],
        "answer": ["7"] * len(references),
        "reference": references,
    })


def _config(tmp_path, **overrides):
    settings = dict(per_device_train_batch_size=8, num_generations=G, max_completion_length=BUDGET, max_steps=1,
                    arg_num_continuations=K, arg_max_accepted=2, arg_min_continuation_tokens=MIN_CONTINUATION,
                    reward_weights=[1.0, 0.2], learning_rate=1e-3, warmup_steps=0, **TINY_ARGS)
    return ARGConfig(output_dir=str(tmp_path), **{**settings, **overrides})


def _trainer(tmp_path, dataset=None, **overrides):
    model, tokenizer = build_tiny_model_and_tokenizer()
    return ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=[accuracy_reward, format_reward],
                      args=_config(tmp_path, **overrides), train_dataset=dataset or _dataset())


def _spy_generation(trainer):
    calls = []
    original = trainer.sample_completion_ids

    def spy(prompt_ids, *args, **kwargs):
        calls.append([list(ids) for ids in prompt_ids])
        return original(prompt_ids, *args, **kwargs)

    trainer.sample_completion_ids = spy
    return calls


def _rows(out, tokenizer):
    """(prompt ids, completion ids) of every row, padding removed."""
    rows = []
    for i in range(out["completion_ids"].shape[0]):
        prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
        completion = out["completion_ids"][i][: int(out["completion_mask"][i].sum())].tolist()
        rows.append((prompt, completion))
    return rows


def _reference_ids(tokenizer, text=REFERENCE):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _hand_advantages(rewards):
    """Eq. 28 per group of G with TRL's stabiliser 1e-4: (R − mean) / (sample std + 1e-4)."""
    grouped = torch.tensor(rewards, dtype=torch.float64).view(-1, G)
    mean, std = grouped.mean(dim=1, keepdim=True), grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).flatten()


def test_failed_groups_get_reference_and_train(tmp_path):
    """Untrained model: every group fails and every continuation fails → the reference replaces one row per group,
    advantages are recomputed on the final group, the policy moves, and continuations take ONE generation call."""
    trainer = _trainer(tmp_path)
    tokenizer = trainer.processing_class
    calls = _spy_generation(trainer)
    outputs = capture_outputs(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    assert [len(c) for c in calls] == [8, 2 * K]  # the groups, then ALL continuations of the step in one call
    reference = _reference_ids(tokenizer) + [tokenizer.eos_token_id]
    rows = _rows(outputs[0], tokenizer)
    rewards = []
    for group in range(2):
        members = rows[group * G : (group + 1) * G]
        assert sum(completion == reference for _, completion in members) == 1  # fallback: the reference, once
        assert len({tuple(prompt) for prompt, _ in members}) == 1  # under the original prompt
        for _, completion in members:
            text = tokenizer.decode(completion, skip_special_tokens=True)
            rewards.append(1.2 if completion == reference else 0.2 * format_reward([text])[0])
    assert all(len(c) <= BUDGET for _, c in rows)
    expected = _hand_advantages(rewards)
    assert torch.allclose(outputs[0]["advantages"].double(), expected, atol=1e-4)
    assert expected.abs().max() > 1.0  # the all-failure groups now carry signal

    metrics = trainer.state.log_history[0]
    assert metrics["arg/all_failure_groups"] == 2 and metrics["arg/fallback_groups"] == 2
    assert metrics["arg/inserted_rows"] == 2 and metrics["arg/groups_with_accepted"] == 0
    assert metrics["arg/continuations"] == 2 * K
    assert math.isclose(sum(metrics[f"arg/selector_prob/alpha_{a:g}"] for a in (1, 0.5, 0.25)), 1.0)
    assert trainer.prefix_selector.num_updates == 1  # all W = 0 and b = 0: logits stay 0 (eq. 12)
    assert torch.equal(trainer.prefix_selector.logits, torch.zeros(3, dtype=torch.float64))
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def _guided_script(trainer, empty_prefix_correct=False):
    """Originals fail; a continuation after a NON-empty reference prefix finishes correctly and differently from the
    reference; an empty-prefix continuation answers 8 (or 7 with `empty_prefix_correct`)."""
    def completion_for(prompt_text, index):
        if len(calls) == 1:
            return "no idea"
        prefix = prompt_text.split(ASSISTANT)[-1]
        if prefix:
            return "Hence \\boxed{7}"
        return "Guess \\boxed{7}" if empty_prefix_correct else "Guess \\boxed{8}"

    calls = script_generation(trainer, completion_for)
    prompts_seen = []
    scripted = trainer.sample_completion_ids

    def record(prompt_ids, *args, **kwargs):
        prompts_seen.append([trainer.processing_class.decode(ids) for ids in prompt_ids])
        return scripted(prompt_ids, *args, **kwargs)

    trainer.sample_completion_ids = record
    return prompts_seen


def _independent_surprisal(prompt_text, reference=REFERENCE):
    """S_t for t = 0..n from a plain forward of the initial tiny model (log_softmax of its logits, eq. 4)."""
    model, tokenizer = build_tiny_model_and_tokenizer()
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    ref = tokenizer(reference, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ref])).logits[0].double()
    logps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)[torch.arange(len(ref)), torch.tensor(ref)]
    return torch.cat([torch.flip(torch.cumsum(torch.flip(-logps, [0]), 0), [0]), torch.zeros(1, dtype=torch.float64)])


def _hand_prefix(surprisal, alpha):
    """§4.1 + App. E.2 by hand: latest t with S_t ≥ α·S_0, then the first cut at or after it, else the latest one."""
    if alpha == 1.0:
        return 0
    t = max(i for i in range(len(surprisal) - 1) if surprisal[i] >= alpha * surprisal[0])
    return 0 if t == 0 else next((c for c in CUTS if c >= t), CUTS[-1])


def test_accepted_continuation_replaces_a_failure_and_feeds_the_selector(tmp_path):
    trainer = _trainer(tmp_path)
    tokenizer = trainer.processing_class
    prompts_seen = _guided_script(trainer)
    twin = PrefixSelector(seed=0)  # same seed: draws the same K levels per failed group
    outputs = capture_outputs(trainer)
    trainer.train()

    levels = twin.sample(2 * K)
    assert len(prompts_seen) == 2 and len(prompts_seen[1]) == 2 * K
    rows = _rows(outputs[0], tokenizer)
    feedback = []
    for group in range(2):
        continuation_prompts = prompts_seen[1][group * K : (group + 1) * K]
        original_prompt = continuation_prompts[0].split(ASSISTANT)[0] + ASSISTANT
        surprisal = _independent_surprisal(original_prompt)
        prefixes = [p.split(ASSISTANT)[-1] for p in continuation_prompts]
        for prefix, alpha in zip(prefixes, levels[group * K : (group + 1) * K]):
            assert len(prefix) == _hand_prefix(surprisal, alpha)  # the selector's level → the snapped cut
            assert REFERENCE.startswith(prefix) and len(prefix) <= BUDGET - MIN_CONTINUATION
            feedback.append(float(surprisal[len(prefix)] / surprisal[0]) if prefix else 0.0)  # eq. 7
        members = rows[group * G : (group + 1) * G]
        guided = sorted((p for p in prefixes if p), key=len)
        if guided:  # accepted: the shortest non-empty prefix + its continuation, EOS-terminated, one row only
            expected = _reference_ids(tokenizer, guided[0] + "Hence \\boxed{7}") + [tokenizer.eos_token_id]
        else:  # no correct candidate: reference fallback
            expected = _reference_ids(tokenizer) + [tokenizer.eos_token_id]
        assert sum(completion == expected for _, completion in members) == 1
        assert all(prompt == members[0][0] for prompt, _ in members)  # trained under the original prompt
        assert tokenizer.decode(members[0][0]) == original_prompt
    assert all(len(c) <= BUDGET for _, c in rows)

    twin.update(levels, feedback)  # eq. 12, then eq. 18
    assert torch.allclose(trainer.prefix_selector.logits, twin.logits, atol=1e-5)
    assert math.isclose(trainer.prefix_selector.baseline, twin.baseline, abs_tol=1e-6)
    assert any(f > 0 for f in feedback)  # the check above is not the trivial all-zero update
    metrics = trainer.state.log_history[0]
    assert metrics["arg/groups_with_accepted"] == sum(
        any(p.split(ASSISTANT)[-1] for p in prompts_seen[1][g * K : (g + 1) * K]) for g in range(2))


def test_empty_prefix_candidates_are_preferred(tmp_path):
    """§4.3: correct empty-prefix candidates are accepted first, up to the cap; a guided one only fills the rest."""
    trainer = _trainer(tmp_path, arg_num_continuations=6, arg_max_accepted=2)
    prompts_seen = _guided_script(trainer, empty_prefix_correct=True)
    outputs = capture_outputs(trainer)
    trainer.train()
    tokenizer = trainer.processing_class
    rows = _rows(outputs[0], tokenizer)
    for group in range(2):
        prefixes = [p.split(ASSISTANT)[-1] for p in prompts_seen[1][group * 6 : (group + 1) * 6]]
        texts = [tokenizer.decode(c, skip_special_tokens=True) for _, c in rows[group * G : (group + 1) * G]]
        empty, guided = prefixes.count(""), sorted((p for p in prefixes if p), key=len)
        expected_empty = min(empty, 2)
        expected_guided = [guided[0] + "Hence \\boxed{7}"] if expected_empty < 2 and guided else []
        assert texts.count("Guess \\boxed{7}") == expected_empty
        assert [t for t in texts if t.endswith("Hence \\boxed{7}")] == expected_guided


@pytest.mark.parametrize("mode", ["reference_insertion", "resampling"])
def test_ablation_modes(tmp_path, mode):
    trainer = _trainer(tmp_path, arg_mode=mode)
    tokenizer = trainer.processing_class

    def completion_for(prompt_text, index):  # resampling: continuations 0-2 (group 0) right, 3-5 (group 1) wrong
        return "Try \\boxed{7}" if len(calls) == 2 and index < K else "no idea"

    calls = script_generation(trainer, completion_for)
    outputs = capture_outputs(trainer)
    trainer.train()
    rows = _rows(outputs[0], tokenizer)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for _, c in rows]
    if mode == "reference_insertion":  # no continuations: the reference replaces one failure per group
        assert calls == [8]
        assert [texts[g * G : (g + 1) * G].count(REFERENCE) for g in range(2)] == [1, 1]
    else:  # K continuations from the empty prefix, correct ones accepted up to the cap, never a fallback
        assert calls == [8, 2 * K]
        assert texts[:G].count("Try \\boxed{7}") == 2 and texts[G:] == ["no idea"] * G
        assert REFERENCE not in texts
    assert trainer.prefix_selector.num_updates == 0  # ablations do not train the selector


def test_the_papers_resampling_keeps_every_correct_continuation(tmp_path):
    """App. G.2: resampling "retains all correct candidate trajectories" — with K = G continuations all correct, the
    whole all-failure group is replaced, ends all-correct and gets zero advantages (eq. 28 on all-equal rewards);
    the other group, never rescued, stays as it was (no fallback)."""
    trainer = _trainer(tmp_path, arg_mode="resampling", arg_max_accepted=None, arg_num_continuations=G)
    assert trainer.args.arg_max_accepted == G
    tokenizer = trainer.processing_class
    calls = script_generation(trainer, lambda prompt, index: "Try \\boxed{7}" if len(calls) == 2 and index < G
                              else "no idea")
    outputs = capture_outputs(trainer)
    trainer.train()
    texts = [tokenizer.decode(c, skip_special_tokens=True) for _, c in _rows(outputs[0], tokenizer)]
    assert calls == [8, 2 * G]
    assert texts == ["Try \\boxed{7}"] * G + ["no idea"] * G
    assert outputs[0]["advantages"].abs().max().item() == 0.0
    assert trainer.state.log_history[0]["arg/replaced_share"] == pytest.approx(G / 8)


def test_long_reference_keeps_the_budget(tmp_path):
    """A reference longer than the budget: no fallback (it would lose its boxed answer; counted); every guided
    prefix leaves at least arg_min_continuation_tokens of the budget; a continuation is cut to the budget left
    after its prefix, so a correct answer past the budget does not count."""
    long_reference = "First we note a fact.\nThen we add three and four.\nSo it is seven.\n\\boxed{7}"
    trainer = _trainer(tmp_path, dataset=_dataset([long_reference] * 8))

    def completion_for(prompt_text, index):  # guided continuations only answer after 40 more tokens
        return "Hence " + "x" * 34 + "\\boxed{7}" if len(calls) == 2 and prompt_text.split(ASSISTANT)[-1] else "no"

    script_generation(trainer, completion_for)
    calls = _spy_generation(trainer)
    outputs = capture_outputs(trainer)
    trainer.train()
    prompt_lengths = {len(ids) for ids in calls[0]}
    prefix_lengths = [len(ids) - min(prompt_lengths) for ids in calls[1]]  # all prompts here have one length
    assert len(prompt_lengths) == 1 and 0 < max(prefix_lengths) <= BUDGET - MIN_CONTINUATION
    assert int(outputs[0]["completion_mask"].sum(dim=1).max()) <= BUDGET
    metrics = trainer.state.log_history[0]
    assert metrics["arg/fallback_too_long"] == 2 and metrics["arg/inserted_rows"] == 0


def test_resume_restores_the_selector(tmp_path):
    """3 steps with a checkpoint each; resuming from checkpoint-2 reaches the uninterrupted run's selector at 3."""
    first = _trainer(tmp_path / "a", max_steps=3, save_strategy="steps", save_steps=1)
    _guided_script(first)
    first.train()
    states = [json.loads((tmp_path / "a" / f"checkpoint-{s}" / SELECTOR_STATE_FILE).read_text()) for s in (1, 2, 3)]
    assert states[1]["logits"] != [0.0, 0.0, 0.0] and states[1]["logits"] != states[2]["logits"]
    assert first.prefix_selector.state_dict() == states[2]

    resumed = _trainer(tmp_path / "b", max_steps=3)
    _guided_script(resumed)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    state = resumed.prefix_selector.state_dict()
    assert state["generator_state"] == states[2]["generator_state"] and state["num_updates"] == 3
    assert torch.allclose(torch.tensor(state["logits"]), torch.tensor(states[2]["logits"]), atol=1e-6)
    assert math.isclose(state["baseline"], states[2]["baseline"], abs_tol=1e-6)


def test_eval_has_no_guidance(tmp_path):
    trainer = _trainer(tmp_path)
    calls = _spy_generation(trainer)
    trainer.model.eval()
    out = trainer._generate_and_score_completions([dict(trainer.train_dataset[0])] * G)
    assert len(calls) == 1 and out["completion_ids"].shape[0] == G


def test_bad_input(tmp_path):
    model, tokenizer = build_tiny_model_and_tokenizer()
    funcs = [accuracy_reward, format_reward]
    args = _config(tmp_path)
    no_column = _dataset().remove_columns("reference")
    with pytest.raises(ValueError, match="`reference` column"):
        ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=funcs, args=args, train_dataset=no_column)
    references = [REFERENCE] * 8
    references[3], references[5] = "   ", "The answer is 7."
    with pytest.raises(ValueError, match="row 3: expected a non-empty"):
        ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=funcs, args=args,
                   train_dataset=_dataset(references))
    references[3] = REFERENCE
    with pytest.raises(ValueError, match=r"row 5: the reference has no final answer marker"):
        ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=funcs, args=args,
                   train_dataset=_dataset(references))
    references[6] = "So \\boxed{7"  # unclosed box
    skipping = ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=funcs,
                          args=_config(tmp_path, arg_skip_invalid_references=True), train_dataset=_dataset(references))
    assert skipping.arg_skipped_references == 2 and len(skipping.train_dataset) == 6
    assert REFERENCE in skipping.train_dataset["reference"] and "So \\boxed{7" not in skipping.train_dataset["reference"]

    with pytest.raises(ValueError, match="arg_max_accepted"):
        _config(tmp_path, arg_max_accepted=G)
    with pytest.raises(ValueError, match="arg_mode"):
        _config(tmp_path, arg_mode="guided")
    with pytest.raises(ValueError, match="arg_min_continuation_tokens"):
        _config(tmp_path, arg_min_continuation_tokens=BUDGET + 1)
    split_groups = _config(tmp_path)
    split_groups.per_device_train_batch_size = 6  # as if 6 rows per process on several processes
    with pytest.raises(ValueError, match="must be a multiple of num_generations"):
        ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=funcs, args=split_groups,
                   train_dataset=_dataset())
    with pytest.raises(TypeError, match="ARGConfig"):
        ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=funcs, args=object(), train_dataset=_dataset())


def test_completion_statistics_describe_the_final_rows(tmp_path):
    """TRL logs lengths, clipped ratio and the token count inside generation, before ARG inserts rows: the logged
    values must be those of the rows that are trained on (here 3 × "no" + the 33-token reference per group)."""
    trainer = _trainer(tmp_path, arg_mode="reference_insertion")
    script_generation(trainer, lambda prompt_text, index: "no")
    outputs = capture_outputs(trainer)
    trainer.train()
    lengths = outputs[0]["completion_mask"].sum(dim=1).float()
    reference_length = len(_reference_ids(trainer.processing_class)) + 1
    assert sorted(lengths.tolist()) == [3.0] * 6 + [float(reference_length)] * 2  # the final rows, by hand
    metrics = trainer.state.log_history[0]
    assert metrics["completions/mean_length"] == pytest.approx((6 * 3 + 2 * reference_length) / 8)
    assert metrics["completions/min_length"] == 3 and metrics["completions/max_length"] == reference_length
    assert metrics["completions/mean_terminated_length"] == pytest.approx((6 * 3 + 2 * reference_length) / 8)
    assert metrics["completions/max_terminated_length"] == reference_length
    assert metrics["completions/clipped_ratio"] == 0
    prompt_tokens = int(outputs[0]["prompt_mask"].sum())
    assert trainer.state.num_input_tokens_seen == prompt_tokens + 6 * 3 + 2 * reference_length
    assert metrics["num_tokens"] == trainer.state.num_input_tokens_seen


def test_collapsed_levels_are_credited_to_their_level_at_the_adjusted_prefix(tmp_path):
    """A reference whose first valid cut lies past the prefix budget: every α < 1 level's adjusted prefix is empty
    (App. E.2: "or the empty prefix if there is none"). Every continuation still enters the selector update with its
    SAMPLED level and W at the adjusted prefix (eq. 12, §4.2 "every continuation", App. H.1), so W = 1·S_0/S_0 = 1
    for each correct one; collapsed levels are only counted."""
    no_cut_in_budget = "We have " + "a" * 40 + " so.\n\\boxed{7}"  # first cut at 54 > 48 − 16
    trainer = _trainer(tmp_path, dataset=_dataset([no_cut_in_budget] * 8), arg_seed=2)
    calls = script_generation(trainer, lambda prompt_text, index: "no idea" if len(calls) == 1 else "Guess \\boxed{7}")
    prompts_seen = _spy_generation(trainer)
    trainer.train()

    assert PrefixSelector(seed=2).sample(2 * K) == [0.25, 1.0, 0.25, 0.5, 0.25, 0.5]  # the draw: n = 1, 2, 3
    prompt_length = len(prompts_seen[0][0])
    assert [len(ids) - prompt_length for ids in prompts_seen[1]] == [0] * (2 * K)  # every level: empty prefix
    # By hand (logits 0, b = 0, ε = 0.2, η = 0.3, levels 1, ½, ¼): q = ρ = 1/3, so ∇ log ρ(a) = 0.8·(e_a − 1/3);
    # all six W = 1, so φ_a = 0.3 · 0.8 · (n_a − 6/3) = 0.24·(n_a − 2) = (−0.24, 0, 0.24); b = 0.1·mean W = 0.1.
    # (Dropping the five collapsed ones, as before, gave 0.24·(e_1 − 1/3) = (0.16, −0.08, −0.08).)
    assert torch.allclose(trainer.prefix_selector.logits, torch.tensor([-0.24, 0.0, 0.24], dtype=torch.float64),
                          atol=1e-6)
    assert math.isclose(trainer.prefix_selector.baseline, 0.1, abs_tol=1e-6)
    metrics = trainer.state.log_history[0]
    assert metrics["arg/collapsed_levels"] == 5 and metrics["arg/continuations"] == 2 * K
    for level in ("1", "0.5", "0.25"):
        assert metrics[f"arg/success_rate/alpha_{level}"] == 1.0
        assert metrics[f"arg/mean_feedback/alpha_{level}"] == 1.0


def test_a_level_that_always_collapses_can_win_the_selector():
    """The toy of the issue, on the pure selector: α = ¼ always collapses to the empty prefix and then succeeds
    (W = 1), while α = ½ is guided and never succeeds and α = 1 succeeds half the time. Crediting every continuation
    to its sampled level (eq. 12) settles on ¼; dropping the collapsed ones could never raise ¼ above its start."""
    rewards = {1.0: [1.0, 0.0], 0.5: [0.0], 0.25: [1.0]}
    for credit_collapsed in (True, False):
        selector = PrefixSelector(seed=0)
        for step in range(200):
            levels = selector.sample(8)
            feedback = [rewards[level][(step + j) % len(rewards[level])] for j, level in enumerate(levels)]
            kept = [(level, w) for level, w in zip(levels, feedback) if credit_collapsed or level != 0.25]
            selector.update([level for level, _ in kept], [w for _, w in kept])
        probs = dict(zip(selector.levels, selector.probs().tolist()))
        if credit_collapsed:
            assert max(probs, key=probs.get) == 0.25 and probs[0.25] > 0.7
        else:
            assert probs[0.25] < 1 / 3


def test_copies_of_the_reference_are_counted_apart_from_successes(tmp_path):
    """A correct continuation that only finishes the reference verbatim is correct but not a success (eq. 4's d_t
    excludes copies): `correct_rate` counts it, `copy_rate` says so, `success_rate` and the rescue rate do not."""
    trainer = _trainer(tmp_path, arg_levels=[0.5])  # one guided level: every continuation has a non-empty prefix

    def completion_for(prompt_text, index):
        if len(calls) == 1:
            return "no idea"  # both groups fail
        prefix = prompt_text.split(ASSISTANT)[-1]
        return REFERENCE[len(prefix):] if index < K else "Hence \\boxed{7}"  # group 0 copies, group 1 differs

    calls = script_generation(trainer, completion_for)
    trainer.train()
    metrics = trainer.state.log_history[0]
    assert metrics["arg/correct_rate/alpha_0.5"] == 1.0
    assert metrics["arg/copy_rate/alpha_0.5"] == 0.5
    assert metrics["arg/success_rate/alpha_0.5"] == 0.5
    assert metrics["arg/groups_with_accepted"] == 1 and metrics["arg/fallback_groups"] == 1
    assert metrics["arg/rescue_rate"] == 0.5  # App. G.2: reference fallback is not a rescue


def test_format_reward_weight_reaches_a_python_user(tmp_path):
    """ARGConfig.format_reward_weight weighs `format_reward` when reward_weights is not set (the paper's
    accuracy + 0.2·format, App. E.3); explicit reward_weights win; other reward lists are untouched."""
    weighted = _trainer(tmp_path / "a", reward_weights=None, format_reward_weight=0.5)
    assert weighted.outcome_reward_weights.tolist() == [1.0, 0.5]
    default = _trainer(tmp_path / "b", reward_weights=None)
    assert default.outcome_reward_weights.tolist() == pytest.approx([1.0, 0.2])
    explicit = _trainer(tmp_path / "c", reward_weights=[1.0, 0.7], format_reward_weight=0.5)
    assert explicit.outcome_reward_weights.tolist() == pytest.approx([1.0, 0.7])
    model, tokenizer = build_tiny_model_and_tokenizer()
    alone = ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=[accuracy_reward],
                       args=_config(tmp_path / "d", reward_weights=None), train_dataset=_dataset())
    assert alone.outcome_reward_weights.tolist() == [1.0]


@pytest.mark.parametrize("mode", ["reference_insertion", "resampling"])
def test_inserted_rows_diagnostics_are_the_policys_own_log_probs(tmp_path, mode):
    """Issue 40 item 4: per step, the share of the batch guidance replaced and the policy's mean log-prob of the
    inserted rows' unsampled tokens (the reference) and sampled ones (a continuation), from an independent forward
    of the starting weights (the step's forward runs before its update)."""
    trainer = _trainer(tmp_path, arg_mode=mode)
    tokenizer = trainer.processing_class
    # The same starting weights, built again (a deepcopy of trainer.model would share TRL's patched LM head, which
    # keeps reading the trained model's weights).
    start, _ = build_tiny_model_and_tokenizer()
    calls = script_generation(trainer, lambda prompt, index: "Try \\boxed{7}" if len(calls) == 2 and index < K
                              else "no idea")
    outputs = capture_outputs(trainer)
    trainer.train()
    rows = _rows(outputs[0], tokenizer)
    inserted = [(p, c) for p, c in rows if tokenizer.decode(c, skip_special_tokens=True) != "no idea"]
    assert len(inserted) == 2  # reference insertion: one per group; resampling: 2 accepted in group 0, none in 1

    def logps(prompt, completion):
        with torch.no_grad():
            logits = start(torch.tensor([prompt + completion])).logits[0].double()
        table = torch.log_softmax(logits, dim=-1)
        return [table[len(prompt) + j - 1, token].item() for j, token in enumerate(completion)]

    tokens = [value for p, c in inserted for value in logps(p, c)]
    metrics = trainer.state.log_history[0]
    assert metrics["arg/replaced_share"] == pytest.approx(2 / 8)
    if mode == "reference_insertion":  # every inserted token is the reference's: none was sampled
        assert metrics["arg/inserted_unsampled_token_share"] == 1.0
        assert metrics["arg/inserted_unsampled_logp"] == pytest.approx(sum(tokens) / len(tokens), abs=1e-4)
        assert "arg/inserted_sampled_logp" not in metrics
    else:  # empty prefixes: every inserted token was sampled
        assert metrics["arg/inserted_unsampled_token_share"] == 0.0
        assert metrics["arg/inserted_sampled_logp"] == pytest.approx(sum(tokens) / len(tokens), abs=1e-4)
        assert "arg/inserted_unsampled_logp" not in metrics


def test_inserted_row_statistics_split_each_row_at_its_prefix():
    from ppm_trl.arg.guidance_step import inserted_row_metrics, inserted_row_statistics

    totals = inserted_row_statistics([[-1.0, -2.0, -0.5, -0.5], [-3.0, -1.0]], [2, 2])  # prefix 2 of 4; a reference
    assert totals == [-7.0, 4, -1.0, 2]
    metrics = inserted_row_metrics(totals, inserted_rows=2, batch_rows=16)
    assert metrics == {"arg/replaced_share": 0.125, "arg/inserted_unsampled_token_share": 4 / 6,
                       "arg/inserted_unsampled_logp": -1.75, "arg/inserted_sampled_logp": -0.5}
    assert inserted_row_metrics([0, 0, 0, 0], 0, 16) == {"arg/replaced_share": 0.0}
