"""The demo pipeline end to end in smoke size, the warm-start cache, and the success metrics' counting."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from types import SimpleNamespace

import pytest

from ppm_trl.demo import RunSpec, main, warmstart
from ppm_trl.envs import make_dataset


def test_quick_demo_writes_results_plot_and_a_loadable_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "demo"
    summary = main(["--quick", "--output-dir", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert summary["n"] == 2
    assert [run["spec"]["variant"] for run in summary["runs"]] == ["segment", "sparse"]
    for run in summary["runs"]:
        history = run["history"]
        # Step 0 (before training) plus one evaluation per step; samples = steps · 8 prompts · G = 8.
        assert [h["step"] for h in history] == [0, 1, 2]
        assert [h["samples"] for h in history] == [0, 64, 128]
        # An all-correct answer has every sub-problem right, so the rate can never exceed per-sub-problem accuracy.
        assert all(0.0 <= h["all_correct"] <= h["per_subproblem"] + 1e-9 <= 1.0 + 1e-9 for h in history)
    assert os.path.getsize(out / "success_vs_samples.png") > 1000
    assert json.loads((out / "results.json").read_text())["n"] == 2
    model = AutoModelForCausalLM.from_pretrained(out / "ppm_model")
    tokenizer = AutoTokenizer.from_pretrained(out / "ppm_model")
    assert model.config.hidden_size == 32 and tokenizer.eos_token == "<|im_end|>"


def test_warm_start_is_cached_by_settings(tmp_path):
    settings = warmstart.WarmStartSettings(horizons=(1,), num_examples=8, max_steps=1, batch_size=4,
                                           hidden_size=32, num_hidden_layers=1, target_per_subproblem=None)
    path = warmstart.warm_start(settings, cache_root=str(tmp_path), progress=False)
    stamp = os.path.getmtime(os.path.join(path, "warmstart.json"))
    assert warmstart.warm_start(settings, cache_root=str(tmp_path), progress=False) == path
    assert os.path.getmtime(os.path.join(path, "warmstart.json")) == stamp  # not retrained
    other = warmstart.WarmStartSettings(horizons=(1,), num_examples=8, max_steps=2, batch_size=4,
                                        hidden_size=32, num_hidden_layers=1, target_per_subproblem=None)
    assert other.key() != settings.key()


def test_evaluate_policy_counts_all_correct_and_per_subproblem(monkeypatch):
    rows = make_dataset("multi_add", 2, 3, seed=0)
    references = rows["reference"]
    lines = [ref.split("\n") for ref in references]
    completions = [
        references[0],  # all correct
        lines[1][0] + "\nwrong\n" + lines[1][2],  # 1 of 2 lines right, no outcome
        references[2] + "\njunk",  # both lines right, outcome fails (termination)
    ]
    monkeypatch.setattr(warmstart, "sample_completions", lambda *args, **kwargs: [[text] for text in completions])
    metrics = warmstart.evaluate_policy(None, None, rows, max_new_tokens=8)
    assert metrics["all_correct"] == pytest.approx(1 / 3)
    assert metrics["per_subproblem"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert metrics["per_point"] == pytest.approx([1.0, 2 / 3])  # line 1 right in all three, line 2 in rows 0 and 2


def test_the_one_sampler_is_seeded_leaves_the_run_alone_and_ignores_generation_config_top_k():
    """The demo's evaluation and `ppm-trl eval` sample through `evaluation.sample_completions`: the draws depend on
    the seed only, an evaluation inside training leaves the global RNG and train mode as they were, and a `top_k`
    in the model's generation config does not truncate the sampling behind the flags (vLLM does not apply it)."""
    import torch

    from ppm_trl.evaluation import sample_completions
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    assert warmstart.sample_completions is sample_completions  # no second copy in the demo
    model, tokenizer = build_tiny_model_and_tokenizer(seed=0, hidden_size=32, num_hidden_layers=1)
    prompts = [row["prompt"] for row in make_dataset("multi_add", 2, 4, seed=0).to_list()]
    model.train()
    rng_before = torch.random.get_rng_state()
    samples = sample_completions(model, tokenizer, prompts, 3, max_new_tokens=12, seed=5)
    assert torch.equal(torch.random.get_rng_state(), rng_before) and model.training
    assert [len(texts) for texts in samples] == [3, 3, 3, 3] and len({t for texts in samples for t in texts}) > 1
    model.generation_config.top_k = 1  # would make every draw greedy if it were applied
    assert sample_completions(model, tokenizer, prompts, 3, max_new_tokens=12, seed=5) == samples
    assert sample_completions(model, tokenizer, prompts, 3, max_new_tokens=12, seed=6) != samples


def test_python_dash_m_demo_parses_its_flags():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "ppm_trl.demo", "--help"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "usage: python -m ppm_trl.demo" in result.stdout and "--quick" in result.stdout


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="variant"):
        RunSpec(variant="ppo")
    with pytest.raises(ValueError, match="horizons"):
        warmstart.WarmStartSettings(horizons=())
    with pytest.raises(ValueError, match="max_steps"):
        warmstart.WarmStartSettings(max_steps=0)
    with pytest.raises(ValueError, match=r"fine_probe_from is an accuracy in \[0, 1\]"):
        warmstart.WarmStartSettings(fine_probe_from=8)


def test_env_recipes_apply_and_overrides_win():
    chain = warmstart.WarmStartSettings.for_env("chain_add")
    assert chain.env == "chain_add" and chain.learning_rate == 1e-3 and chain.probe_every == 10
    assert warmstart.WarmStartSettings.for_env("chain_add", learning_rate=3e-3).learning_rate == 3e-3
    assert warmstart.WarmStartSettings.for_env("multi_add") == warmstart.WarmStartSettings()  # no recipe: defaults
    assert chain.key() != warmstart.WarmStartSettings(env="chain_add").key()


def test_fine_probe_probes_every_step_once_close_and_stops_at_target(monkeypatch):
    """`fine_probe_from`: coarse cadence until the probe reaches it, then every step, until the target stops SFT."""
    settings = warmstart.WarmStartSettings(env="chain_add", probe_horizon=2, probe_size=2, probe_every=10,
                                           target_per_subproblem=0.5, fine_probe_from=0.1)
    accuracy = {10: 0.02, 20: 0.12, 21: 0.2, 22: 0.3, 23: 0.55}
    monkeypatch.setattr(warmstart, "evaluate_policy",
                        lambda model, tok, probe, budget, seed: {"all_correct": 0.0, "per_subproblem": accuracy[seed]})
    probes: list = []
    callback = warmstart._accuracy_probe(settings, None, probes)
    control = SimpleNamespace(should_training_stop=False)
    for step in range(1, 30):
        callback.on_step_end(None, SimpleNamespace(global_step=step), control, model=None)
        if control.should_training_stop:
            break
    assert [p["step"] for p in probes] == [10, 20, 21, 22, 23] and step == 23


def test_settings_added_later_keep_old_cache_keys():
    settings = warmstart.WarmStartSettings()
    legacy = {k: v for k, v in dataclasses.asdict(settings).items() if k != "fine_probe_from"}
    digest = hashlib.sha256(json.dumps({"version": warmstart.WARMSTART_VERSION, **legacy}, sort_keys=True).encode())
    assert settings.key() == digest.hexdigest()[:16]
    assert warmstart.WarmStartSettings(fine_probe_from=0.1).key() != settings.key()


def test_demo_arguments_from_flags_and_yaml(tmp_path):
    from ppm_trl.demo import DemoArguments, parse_args

    config = tmp_path / "demo.yaml"
    config.write_text("steps: 5\nhorizons: [2, 3]\nquick: true\n")
    args = parse_args(["--config", str(config), "--eval-every", "2", "--output_dir", str(tmp_path / "o")])
    assert isinstance(args, DemoArguments)
    assert (args.steps, args.horizons, args.quick, args.eval_every) == (5, [2, 3], True, 2)  # flags over YAML
    assert args.output_dir == str(tmp_path / "o") and args.n is None
    with pytest.raises(ValueError, match="--steps must be >= 1, got 0"):
        parse_args(["--steps", "0"])
    with pytest.raises(ValueError, match="no_such_key"):
        config.write_text("no_such_key: 1\n")
        parse_args(["--config", str(config)])
