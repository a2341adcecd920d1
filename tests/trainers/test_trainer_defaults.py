"""Trainers build like TRL's GRPOTrainer: without `args` (the method's default config) and without `reward_funcs`
where GRPOTrainer takes none."""

from __future__ import annotations

import inspect

import pytest

METHODS = ("ppm", "papo", "arg", "ppm+arg", "papo+arg")


@pytest.mark.parametrize("method", METHODS)
def test_trainer_without_args_builds_the_methods_default_config(tmp_path, monkeypatch, method):
    from ppm_trl import make_dataset
    from ppm_trl.registry import get_method
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

    from ppm_trl.registry import get_method

    trl_default = inspect.signature(GRPOTrainer).parameters["reward_funcs"].default
    ours = inspect.signature(get_method(method).trainer_class()).parameters["reward_funcs"]
    assert trl_default is None and ours.default is None


def test_ppm_without_any_reward_source_gets_trls_own_message(tmp_path, monkeypatch):
    from ppm_trl import PPMGRPOTrainer, make_dataset

    monkeypatch.chdir(tmp_path)
    # before: "missing 1 required positional argument: 'reward_funcs'"; now TRL's check speaks
    with pytest.raises(ValueError, match="No reward source provided"):
        PPMGRPOTrainer("tiny", train_dataset=make_dataset("multi_add", n=2, size=16))


# ------------------------------------------------------------------ the end of a Python run (as `ppm-trl train`)
def _ppm_run(tmp_path, completion_for=None):
    from helpers import TINY_ARGS, script_generation

    from ppm_trl import PPMConfig, PPMGRPOTrainer, make_dataset
    from ppm_trl.rewards import env_outcome_reward

    dataset = make_dataset("multi_countdown", 2, 4, seed=0)
    args = PPMConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, num_segments=2,
                     max_completion_length=64, max_steps=2, **TINY_ARGS)
    trainer = PPMGRPOTrainer("tiny", reward_funcs=env_outcome_reward, args=args, train_dataset=dataset)
    if completion_for is not None:
        script_generation(trainer, lambda prompt, index: completion_for(dataset, prompt, index))
    trainer.train()
    return trainer


def test_python_run_that_learned_nothing_says_so_and_prints_its_summary(tmp_path, capsys):
    import json

    # every completion of the untrained tiny model fails: every group has zero advantage and is filtered
    _ppm_run(tmp_path, lambda dataset, prompt, index: "no idea")
    out, err = capsys.readouterr()
    summary = json.loads(out.split("ppm_trl: done ", 1)[1].splitlines()[0])
    assert summary["method"] == "ppm" and summary["steps"] == 2 and summary["output_dir"] == str(tmp_path)
    assert summary["metrics_mean"]["ppm/frac_rows_filtered"] == 1.0
    assert "ppm_trl: warning: nothing was learned: every group had zero advantage" in err


def test_python_run_that_learned_does_not_warn(tmp_path, capsys):
    def half_right(dataset, prompt, index):  # two of each group's four completions solve the problem
        reference = next(row["reference"] for row in dataset if row["prompt"][0]["content"] in prompt)
        return reference if index % 2 == 0 else "no idea"

    trainer = _ppm_run(tmp_path, half_right)
    out, err = capsys.readouterr()
    assert "ppm_trl: done " in out and "nothing was learned" not in err
    assert max(entry.get("grad_norm", 0.0) for entry in trainer.state.log_history) > 0
