"""End-to-end PPMGRPOTrainer on the tiny model: real TRL step, scripted completions, programmatic scorer."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import TINY_ARGS, build_trainer, capture_outputs, script_generation

from ppm_trl.envs import make_dataset
from ppm_trl.ppm.ppm_config import PPMConfig
from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer
from ppm_trl.tiny import build_tiny_model_and_tokenizer

G, K, BUDGET = 4, 4, 64


def _reference_for(dataset, prompt_text):
    for row in dataset:
        if row["prompt"][0]["content"] in prompt_text:
            return row["reference"]
    raise AssertionError("prompt not in dataset")


def _trainer(tmp_path, dataset, **overrides):
    settings = dict(per_device_train_batch_size=8, num_generations=G, max_completion_length=BUDGET, num_segments=K,
                    max_steps=2)
    return build_trainer("ppm", tmp_path, train_dataset=dataset, **{**settings, **overrides})


def test_segment_advantages_follow_progress(tmp_path):
    """Real programmatic matcher, one line per 32-token segment, so every m_k and r_k is known by hand."""
    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    trainer = _trainer(tmp_path, dataset, max_completion_length=128, filter_zero_advantage_groups=False)

    def pad(line):  # one byte-level token per character: a padded line fills exactly one 32-token segment
        return line.ljust(31) + "\n"

    def completion_for(prompt_text, index):
        p1, p2, box = _reference_for(dataset, prompt_text).split("\n")
        return {
            0: pad(p1) + pad(p2) + box,  # m = [1/3, 2/3, 1, -], outcome 1
            1: pad("x" * 10) + pad(p1) + "y" * 20,  # m = [0, 1/3, 1/3, -], outcome 0
            2: "z" * 60,  # m = [0, 0, -, -]
            3: pad(p1) + pad(p2),  # m = [1/3, 2/3, 2/3 (segment 3 holds only EOS), -]
        }[index % G]

    script_generation(trainer, completion_for)
    outputs = capture_outputs(trainer)
    trainer.train()

    out = outputs[0]
    adv = out["advantages"]
    assert adv.shape == out["completion_ids"].shape  # (B, T) per-token advantages
    mask = out["completion_mask"].bool()
    assert torch.all(adv[~mask] == 0)  # padding carries 0
    # Rewards r_k = m_k - m_{k-1} (+1 outcome on valid segments), empty segments 0:
    #   row0 [4/3, 4/3, 4/3, 0]; row1 [0, 1/3, 0, 0]; row2 [0, 0, 0, 0]; row3 [1/3, 1/3, 0, 0]
    # Segment means: [5/12, 1/2, 1/3, 0]; advantages = r - mean (no std division by default):
    expected = {
        0: [11 / 12, 5 / 6, 1.0],
        1: [-5 / 12, -1 / 6, -1 / 3],
        2: [-5 / 12, -1 / 2],
        3: [-1 / 12, -1 / 6, -1 / 3],
    }
    for row, values in expected.items():
        for k, value in enumerate(values):
            tokens = adv[row, 32 * k : 32 * (k + 1)][mask[row, 32 * k : 32 * (k + 1)]]
            assert tokens.numel() > 0
            assert torch.allclose(tokens, torch.full_like(tokens, value), atol=1e-5), (row, k, tokens[:3], value)
    # One completion's advantages differ across its segments when its progress does.
    assert len({round(v, 6) for v in expected[1]}) == 3


def test_hand_computed_token_advantages(tmp_path):
    """A fixed scorer → the exact (B, T) tensor, computed by hand (budget 64, K = 4: 16-token chunks)."""
    dataset = make_dataset("multi_countdown", 1, 2, seed=1)
    trainer = _trainer(tmp_path, dataset, filter_zero_advantage_groups=False, max_steps=1)
    table = [[0.5] * 4, [0.0, 1.0, 1.0, 1.0], [0.0] * 4, [0.5] * 4]
    trainer.progress_scorer = lambda rows, texts: torch.tensor([table[i % G] for i in range(len(rows))])
    texts = ["a", "b" * 63, "ccc", "dddd"]  # + EOS: 2, 64, 4, 5 tokens → valid segments {1}, {1..4}, {1}, {1}
    script_generation(trainer, lambda prompt, index: texts[index % G])
    outputs = capture_outputs(trainer)
    trainer.train()
    adv = outputs[0]["advantages"]
    # Rewards (outcome 0): row0 [.5,0,0,0], row1 [0,1,0,0], row2 [0,0,0,0], row3 [.5,0,0,0] (empty segments 0).
    # Segment means [.25, .25, 0, 0] → row0 [.25], row1 [-.25, .75, 0, 0], row2 [-.25], row3 [.25].
    for i, value in enumerate([0.25, -0.25, -0.25, 0.25]):
        assert math.isclose(float(adv[i, 0]), value, abs_tol=1e-6)
    assert torch.allclose(adv[1, 16:32], torch.full((16,), 0.75))
    assert torch.all(adv[1, 32:] == 0)


def test_bad_scorer_output_is_a_clear_error(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=1)
    trainer = _trainer(tmp_path, dataset, max_steps=1)
    trainer.progress_scorer = lambda rows, texts: torch.full((len(rows), K), 1.5)
    script_generation(trainer, lambda prompt, index: "abc")
    with pytest.raises(ValueError, match=r"outside \[0, 1\].*row 0"):
        trainer.train()


def test_missing_reasoning_points_is_a_clear_error(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=1).remove_columns(["reasoning_points"])
    with pytest.raises(ValueError, match="reasoning_points"):
        _trainer(tmp_path, dataset)


def test_bad_graph_names_row_and_rule(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=1)
    graphs = list(dataset["reasoning_graph"])
    graphs[1] = [{"if_all": [9], "makes_obsolete": [1]}]
    dataset = dataset.remove_columns(["reasoning_graph"]).add_column("reasoning_graph", graphs)
    with pytest.raises(ValueError, match=r"row 1.*rule 0.*out of range"):
        _trainer(tmp_path, dataset)


def test_unscorable_completion_gets_zero_advantage(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=1)
    trainer = _trainer(tmp_path, dataset, filter_zero_advantage_groups=False, max_steps=1)

    def scorer(rows, texts):
        out = torch.tensor([[0.0, 0.5, 1.0, 1.0]] * len(rows))
        out[0] = float("nan")  # the judge failed on the first completion
        out[1] = torch.tensor([1.0, 1.0, 1.0, 1.0])
        return out

    trainer.progress_scorer = scorer
    script_generation(trainer, lambda prompt, index: "w" * 63)
    outputs = capture_outputs(trainer)
    trainer.train()
    adv = outputs[0]["advantages"]
    assert torch.all(adv[0] == 0)
    assert adv[1].abs().sum() > 0


@pytest.mark.parametrize(
    "loss_type,extra",
    [("grpo", {}), ("dapo", {}), ("bnpo", {}), ("dr_grpo", {}), ("cispo", {}), ("sapo", {}),
     ("grpo", {"importance_sampling_level": "sequence", "granularity": "trajectory"}),  # GSPO: one advantage/row
     ("dapo", {"steps_per_generation": 2, "num_iterations": 2})],
)
def test_every_loss_type_trains_on_token_advantages(tmp_path, loss_type, extra):
    dataset = make_dataset("multi_countdown", 1, 4, seed=2)
    settings = {"filter_zero_advantage_groups": False, "max_steps": 2, "loss_type": loss_type, **extra}
    if "steps_per_generation" in extra:
        settings["per_device_train_batch_size"] = 4
    trainer = _trainer(tmp_path, dataset, **settings)
    trainer.progress_scorer = lambda rows, texts: torch.rand(len(rows), K, generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    script_generation(trainer, lambda prompt, index: "q" * (10 + 13 * (index % G)))
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses and all(math.isfinite(float(v)) for v in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_identical_progress_groups_are_filtered_from_the_loss(tmp_path):
    # G = 8 identical completions with progress 3/5 everywhere: the float32 group mean of 3/5 + outcome is off by an
    # ulp, which escaped the zero-advantage filter before (rows stayed in the loss and in num_items_in_batch).
    dataset = make_dataset("multi_countdown", 1, 1, seed=3)
    trainer = _trainer(tmp_path, dataset, num_generations=8, max_steps=1)
    trainer.progress_scorer = lambda rows, texts: torch.full((len(rows), K), 3 / 5)
    script_generation(trainer, lambda prompt, index: "same text for every row")
    outputs = capture_outputs(trainer)
    trainer.train()
    out = outputs[0]
    assert torch.all(out["advantages"] == 0)
    assert out["completion_mask"].sum() == 0 and int(out["num_items_in_batch"]) == 0
    logged = next(log for log in trainer.state.log_history if "ppm/frac_rows_filtered" in log)
    assert logged["ppm/frac_rows_filtered"] == 1.0 and logged["ppm/frac_groups_nonzero_advantage"] == 0.0


def test_unscorable_outcome_is_counted(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=1)

    def outcome(completions, **kwargs):  # the verifier cannot read the first completion of each group
        return [None if i % G == 0 else 1.0 for i in range(len(completions))]

    model, tokenizer = build_tiny_model_and_tokenizer()
    args = PPMConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=G,
                     max_completion_length=BUDGET, num_segments=K, max_steps=1, filter_zero_advantage_groups=False,
                     **TINY_ARGS)
    trainer = PPMGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=outcome, args=args,
                             train_dataset=dataset)
    trainer.progress_scorer = lambda rows, texts: torch.full((len(rows), K), 0.5)
    script_generation(trainer, lambda prompt, index: "w" * (5 + index))
    outputs = capture_outputs(trainer)
    trainer.train()
    logged = next(log for log in trainer.state.log_history if "ppm/unscorable_frac" in log)
    assert logged["ppm/outcome_unscorable_frac"] == 0.25 and logged["ppm/unscorable_frac"] == 0.25
    assert torch.all(outputs[0]["advantages"][0] == 0)


@pytest.mark.parametrize(
    "option",
    [{"loss_type": "vespo"}, {"off_policy_mask_threshold": 0.5}, {"importance_sampling_level": "sequence"},
     {"loss_type": "luspo", "importance_sampling_level": "sequence"}],
)
def test_sequence_level_options_are_refused_with_segment_advantages(tmp_path, option):
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, **TINY_ARGS)
    with pytest.raises(ValueError, match="granularity='segment' does not support .*change sign inside a completion"):
        PPMConfig(**settings, **option)
    PPMConfig(**settings, granularity="trajectory", **option)  # one advantage per completion: well defined


def test_config_refuses_undefined_estimators(tmp_path):
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, **TINY_ARGS)
    with pytest.raises(ValueError, match="progress_mode='process_reward' is not an estimator"):
        PPMConfig(**settings, granularity="trajectory", progress_mode="process_reward")
    PPMConfig(**settings, multi_objective_aggregation="normalize_then_sum")  # the outcome part: see test_advantages
    for granularity, mode in [("segment", "ppm"), ("segment", "exact_order"), ("segment", "process_reward"),
                              ("trajectory", "ppm"), ("trajectory", "exact_order")]:
        PPMConfig(**settings, granularity=granularity, progress_mode=mode)  # each pair selects an estimator
    for option in (dict(granularity="token"), dict(progress_mode="ppm_segment")):
        with pytest.raises(ValueError, match="is not supported; accepted values"):
            PPMConfig(**settings, **option)


def test_batch_scale_rewards_reaches_the_estimator(tmp_path):
    dataset = make_dataset("multi_countdown", 1, 2, seed=2)
    trainer = _trainer(tmp_path, dataset, scale_rewards="batch", filter_zero_advantage_groups=False, max_steps=1)
    progress = torch.rand(8, K, generator=torch.Generator().manual_seed(1))
    trainer.progress_scorer = lambda rows, texts: progress[: len(rows)]
    script_generation(trainer, lambda prompt, index: "v" * 70)  # every segment valid
    outputs = capture_outputs(trainer)
    outcomes = []  # the gathered weighted outcome each step's advantage hook received
    hook = trainer.compute_advantages
    trainer.compute_advantages = lambda batch: outcomes.append(batch.outcome.cpu()) or hook(batch)
    trainer.train()
    from ppm_trl.ppm.ppm_estimators import ppm_segment_advantages

    expected = ppm_segment_advantages(progress, outcomes[0], G, scale="batch")
    tokens = outputs[0]["advantages"][:, :16]  # segment 1 = tokens 0..15 of the 64-token budget
    assert torch.allclose(tokens, expected[:, :1].expand(-1, 16), atol=1e-6)
    assert not torch.allclose(expected, ppm_segment_advantages(progress, outcomes[0], G, scale="group"))


def test_line_segments_follow_the_lines_of_each_completion(tmp_path):
    """segmentation="delimiter": each newline closes a segment, wherever it falls in the token budget, so segment k
    is sub-problem k of this completion (the chunk boundaries of `equal_chunks` ignore the text). Hand-computed."""
    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    trainer = _trainer(tmp_path, dataset, max_completion_length=128, num_segments=3, segmentation="delimiter",
                       filter_zero_advantage_groups=False)
    pieces = {}

    def completion_for(prompt_text, index):
        p1, p2, box = _reference_for(dataset, prompt_text).split("\n")
        text = {
            0: f"{p1}\n{p2}\n{box}",  # pieces p1 | p2 | box: m = [1/3, 2/3, 1], outcome 1
            1: f"xx\n{p1}\nyy",  # m = [0, 1/3, 1/3], outcome 0
            2: "zzz",  # one piece: segments 2-3 empty
            3: f"{p1}\n{p2}\n",  # the trailing newline opens no piece: segment 3 empty
        }[index % G]
        pieces.setdefault(index, [len(tokenizer(piece + "\n", add_special_tokens=False)["input_ids"])
                                  for piece in text.split("\n")])  # tokens of each line with its newline
        return text

    tokenizer = trainer.processing_class

    script_generation(trainer, completion_for)
    outputs = capture_outputs(trainer)
    trainer.train()
    out = outputs[0]
    adv, mask = out["advantages"], out["completion_mask"].bool()
    # r_k: row0 [4/3, 4/3, 4/3]; row1 [0, 1/3, 0]; row2 [0, -, -]; row3 [1/3, 1/3, -] (empty segments 0).
    # Segment means [5/12, 1/2, 1/3] → advantages:
    expected = {0: [11 / 12, 5 / 6, 1.0], 1: [-5 / 12, -1 / 6, -1 / 3], 2: [-5 / 12], 3: [-1 / 12, -1 / 6]}
    for row, values in expected.items():
        lengths = pieces[row]
        spans, start = [], 0  # token spans of the pieces (the last one's EOS follows it)
        for k in range(len(values)):
            spans.append((start, start + lengths[k]))
            start += lengths[k]
        for (start, end), value in zip(spans, values):
            tokens = adv[row, start:end][mask[row, start:end]]
            assert tokens.numel() > 0
            assert torch.allclose(tokens, torch.full_like(tokens, value), atol=1e-5), (row, start, end, value)
        rest = adv[row, start:][mask[row, start:]]  # nothing after the last piece differs from it
        assert torch.allclose(rest, torch.full_like(rest, values[-1]), atol=1e-5)
    assert torch.all(adv[~mask] == 0)


def test_a_bad_delimiter_is_refused_at_config_time(tmp_path):
    with pytest.raises(ValueError, match="segment_delimiter='\\(' is not a valid regular expression"):
        PPMConfig(output_dir=str(tmp_path), segmentation="delimiter", segment_delimiter="(", num_generations=8,
                  **TINY_ARGS)
    with pytest.raises(ValueError, match="matches the empty string"):
        PPMConfig(output_dir=str(tmp_path), segmentation="delimiter", segment_delimiter="\\n*", num_generations=8,
                  **TINY_ARGS)


@pytest.mark.parametrize("change", ["row replaced", "row grown in place", "rows swapped"])
def test_early_scoring_check_fires_when_the_ids_change_after_submit(tmp_path, change):
    """`overlap_scoring` scores the ids it was handed at `on_final_rollout`; if TRL then rewards other ids, the
    progress would belong to other completions. The check compares with a copy taken at submit, so it fires for a
    replaced row, a row list changed in place and a reordering alike."""
    dataset = make_dataset("multi_countdown", 1, 2, seed=2)
    trainer = _trainer(tmp_path, dataset, max_steps=1)
    script_generation(trainer, lambda prompt, index: "v" * (10 + index))
    submit = trainer.on_final_rollout

    def on_final_rollout(rollout):
        pending = submit(rollout)  # scoring starts on these ids
        ids = rollout.completion_ids
        if change == "row replaced":
            ids[0] = ids[0][:-1]
        elif change == "row grown in place":
            ids[1].append(ids[1][-1])
        else:
            ids[0], ids[1] = ids[1], ids[0]
        return pending

    trainer.on_final_rollout = on_final_rollout
    with pytest.raises(RuntimeError, match="the completions scored early are not the ones TRL rewards"):
        trainer.train()
