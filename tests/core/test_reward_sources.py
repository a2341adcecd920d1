"""`ppm-trl train --reward_funcs` reads names as `trl grpo` does (issue 43 item 2): ours, TRL's, or a dotted import
path to the user's own function; `--reward_model_name_or_path` adds a reward model. A path that cannot be imported
or is not callable is one error naming it, before any model is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml

from ppm_trl.flags import UsageError
from ppm_trl.reward_sources import TRL_REWARDS, load_reward, reward_columns

MY_REWARDS = textwrap.dedent("""
    calls = []

    def length_bonus(completions, **columns):
        calls.append(sorted(columns))
        return [min(1.0, len(str(c)) / 100) for c in completions]

    NOT_A_FUNCTION = 3
""")


@pytest.fixture
def my_rewards(tmp_path, monkeypatch):
    """A user's `my_rewards.py` in the working directory (as `trl grpo` finds it)."""
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def test_ours_trls_and_a_dotted_path_resolve(my_rewards):
    import trl.rewards

    from ppm_trl.rewards import accuracy_reward

    assert load_reward("accuracy") is accuracy_reward
    assert load_reward("think_format_reward") is trl.rewards.think_format_reward
    assert reward_columns("accuracy_reward") == ("solution",)  # TRL's reads the `solution` column
    assert callable(load_reward("get_soft_overlong_punishment"))  # a factory, called as TRL's script calls it
    custom = load_reward("my_rewards.length_bonus")
    assert custom(["x" * 50], n=[1]) == [0.5]
    assert set(TRL_REWARDS) == {"accuracy_reward", "reasoning_accuracy_reward", "think_format_reward",
                                "get_soft_overlong_punishment"}


@pytest.mark.parametrize("name,message", [
    ("no_such_module.reward", "importing 'no_such_module' failed (ModuleNotFoundError"),
    ("my_rewards.missing", "module 'my_rewards' ("),
    ("my_rewards.NOT_A_FUNCTION", "is a int, not a callable"),
    ("telepathy", "unknown reward function 'telepathy': give one of"),
])
def test_a_reward_that_cannot_be_used_is_one_error_naming_it(my_rewards, name, message):
    with pytest.raises(UsageError, match=None) as error:
        load_reward(name)
    assert message in str(error.value) and name.split(".")[-1] in str(error.value)


def test_a_broken_import_path_stops_train_before_the_model_loads(my_rewards, capsys):
    from ppm_trl import cli

    config = my_rewards / "config.yaml"
    config.write_text(yaml.safe_dump({"method": "ppm", "model_name_or_path": "./no/such/model", "env_name":
                                      "multi_add", "output_dir": "out", "reward_funcs": ["my_rewards.missing"]}))
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--config", str(config)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "has no attribute 'missing'" in err and "Traceback" not in err


def test_train_with_a_users_reward_and_a_reward_model_from_yaml(my_rewards):
    """One step of GRPO from a YAML config: the user's function by its import path, plus a tiny reward model."""
    from transformers import AutoModelForSequenceClassification

    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    policy, tokenizer = build_tiny_model_and_tokenizer()
    policy.config.num_labels, policy.config.pad_token_id = 1, tokenizer.pad_token_id
    reward_model = AutoModelForSequenceClassification.from_config(policy.config)
    reward_model.save_pretrained(my_rewards / "rm")
    tokenizer.save_pretrained(my_rewards / "rm")
    config = my_rewards / "config.yaml"
    config.write_text(yaml.safe_dump({
        "method": "grpo", "model_name_or_path": "tiny", "env_name": "multi_add", "env_n": 1, "env_size": 8,
        "reward_funcs": ["env_outcome", "my_rewards.length_bonus"], "reward_model_name_or_path": str(my_rewards / "rm"),
        "output_dir": str(my_rewards / "out"), "use_cpu": True, "bf16": False, "gradient_checkpointing": False,
        "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8, "max_steps": 1,
        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0}))
    result = subprocess.run([sys.executable, "-m", "ppm_trl.cli", "train", "--config", str(config)], cwd=my_rewards,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    done = next(line for line in result.stdout.splitlines() if line.startswith("ppm-trl train: done"))
    means = json.loads(done.split("done ", 1)[1])["metrics_mean"]
    assert 0 < means["rewards/length_bonus/mean"] <= 1  # the user's function scored every completion
    assert "rewards/env_outcome_reward/mean" in means
    assert means["rewards/rm/mean"] != 0  # the reward model (named by its folder) scored them too


def test_the_readme_command_with_a_users_reward_runs_as_written(tmp_path):
    """README "Command line": the `--reward_funcs ... my_rewards.length_bonus` line, verbatim, from a directory that
    holds the config it names and the user's `my_rewards.py`."""
    import shlex
    import shutil
    from pathlib import Path

    from helpers import readme_block

    block = readme_block("Command line", "bash", 1)
    (command,) = [line for line in block.splitlines() if line.startswith("ppm-trl train")]
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "configs").mkdir()
    shutil.copy(root / "configs" / "ppm_tiny_countdown.yaml", tmp_path / "configs")
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    argv = shlex.split(command.split("#")[0])
    result = subprocess.run([sys.executable, "-m", "ppm_trl.cli", *argv[1:]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    done = next(line for line in result.stdout.splitlines() if line.startswith("ppm-trl train: done"))
    assert "rewards/length_bonus/mean" in json.loads(done.split("done ", 1)[1])["metrics_mean"]
