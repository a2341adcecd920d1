"""Trainers build like TRL's GRPOTrainer: without `args` (the method's default config) and without `reward_funcs`
where GRPOTrainer takes none."""

from __future__ import annotations

import inspect

import pytest

METHODS = ("ppm", "papo", "arg", "ppm+arg", "papo+arg")


@pytest.mark.parametrize("method", METHODS)
def test_trainer_without_args_builds_the_methods_default_config(tmp_path, monkeypatch, method):
    from ppm_trl import make_dataset
    from ppm_trl.methods import get_method
    from ppm_trl.rewards import env_outcome_reward

    monkeypatch.chdir(tmp_path)  # the default output_dir is relative, as GRPOTrainer's
    registered = get_method(method)
    trainer = registered.trainer_class()("tiny", reward_funcs=env_outcome_reward,
                                         train_dataset=make_dataset("multi_add", n=2, size=16))
    assert type(trainer.args) is registered.config_class()
    assert trainer.args.output_dir == f"tiny-{method.upper().replace('+', '-')}"
    # the method's own defaults, and whole groups in each generation batch (PPM: 16 against TRL's batch of 8)
    expected_generations = 16 if method.startswith("ppm") else 8
    assert trainer.args.num_generations == expected_generations
    assert trainer.args.generation_batch_size % expected_generations == 0
    assert (tmp_path / trainer.args.output_dir / "initial_tiny_model" / "config.json").exists()


@pytest.mark.parametrize("method", METHODS)
def test_reward_funcs_is_optional_where_grpo_trainers_is(method):
    from trl import GRPOTrainer

    from ppm_trl.methods import get_method

    trl_default = inspect.signature(GRPOTrainer).parameters["reward_funcs"].default
    ours = inspect.signature(get_method(method).trainer_class()).parameters["reward_funcs"]
    assert trl_default is None and ours.default is None


def test_ppm_without_any_reward_source_gets_trls_own_message(tmp_path, monkeypatch):
    from ppm_trl import PPMGRPOTrainer, make_dataset

    monkeypatch.chdir(tmp_path)
    # before: "missing 1 required positional argument: 'reward_funcs'"; now TRL's check speaks
    with pytest.raises(ValueError, match="No reward source provided"):
        PPMGRPOTrainer("tiny", train_dataset=make_dataset("multi_add", n=2, size=16))
