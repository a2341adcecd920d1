"""The method registry: the one table the CLI, the examples, the demo and `ppm_trl`'s exports read."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from trl import GRPOConfig, GRPOTrainer

import ppm_trl
from ppm_trl import methods
from ppm_trl.data import prepare_dataset
from ppm_trl.flags import UsageError
from ppm_trl.registry import (
    METHODS,
    REWARDS,
    Method,
    Reward,
    get_method,
    get_reward,
    register_method,
    reward_of_function,
)
from ppm_trl.train import TrainScriptArguments, reward_names


def test_every_method_names_importable_trl_classes():
    assert {"grpo", "ppm", "papo", "arg", "ppm+arg", "papo+arg"} <= set(METHODS)
    for method in METHODS.values():
        assert issubclass(method.config_class(), GRPOConfig), method.name
        assert issubclass(method.trainer_class(), GRPOTrainer), method.name


def test_ppm_trl_exports_every_registered_trainer_and_config():
    for method in METHODS.values():
        if method.name == "grpo":
            continue
        for path in (method.trainer, method.config):
            name = path.split(":")[1]
            assert name in ppm_trl.__all__
            assert getattr(ppm_trl, name) is getattr(method, "trainer_class" if path == method.trainer else
                                                     "config_class")()


def test_unknown_and_duplicate_methods_are_errors():
    with pytest.raises(ValueError, match=re.escape("unknown method 'ppo'; accepted: grpo, ppm, papo, arg, opsd, verifree, ppm+arg, papo+arg")):
        get_method("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_method(Method("ppm", "ppm_trl.ppm.ppm_config:PPMConfig", "ppm_trl.ppm.ppm_trainer:PPMGRPOTrainer"))
    assert get_method("arg").extra_rewards == ("format",)


def test_each_method_is_registered_by_its_own_folder():
    """ppm_trl's method folders, found by their `<name>_trainer.py`, in the listed order; each registers the config
    and trainer of its own folder."""
    assert methods.method_folders() == ["ppm", "papo", "arg", "opsd", "verifree"]
    for name in methods.method_folders():
        assert METHODS[name].trainer.startswith(f"ppm_trl.{name}.{name}_trainer:")
        assert METHODS[name].config.startswith(f"ppm_trl.{name}.{name}_config:")
    assert list(METHODS)[:4] == ["grpo", "ppm", "papo", "arg"]


# ------------------------------------------------------------------ one registration reaches every reader
REPO = Path(__file__).resolve().parents[2]


def _design_example() -> tuple[str, str]:
    """The trainer file and the `__init__.py` of docs/design.md's "Adding a method", as written there."""
    section = (REPO / "docs" / "design.md").read_text().split("## Adding a method", 1)[1].split("\n## ", 1)[0]
    trainer_file, registration = re.findall(r"```python\n(.*?)```", section, re.S)
    return trainer_file, registration


@pytest.fixture
def sign_method(monkeypatch, tmp_path):
    """The docs' example method added the way the docs say: one new folder `sign/` beside ppm_trl's method folders
    (here on `ppm_trl.__path__`, so that the checkout itself is not written), its two files as the page shows them,
    found by the registry's own folder discovery. Nothing else is touched."""
    trainer_file, registration = _design_example()
    folder = tmp_path / "methods" / "sign"
    folder.mkdir(parents=True)
    (folder / "sign_trainer.py").write_text(trainer_file)
    (folder / "__init__.py").write_text(registration)
    monkeypatch.setattr(ppm_trl, "__path__", [*ppm_trl.__path__, str(folder.parent)])
    importlib.invalidate_caches()
    try:
        assert "sign" in methods.method_folders()
        methods.load_method_folders()
        yield METHODS["sign"]
    finally:
        METHODS.pop("sign", None)
        for name in ("ppm_trl.sign.sign_trainer", "ppm_trl.sign"):
            sys.modules.pop(name, None)


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_the_docs_example_method_trains_through_the_cli_and_names_itself_in_the_card(sign_method, tmp_path, capsys):
    from huggingface_hub import ModelCard

    from ppm_trl import cli

    rows = [{"prompt": f"What is {a} + {a}? Answer in \\boxed{{}}.", "answer": str(2 * a), "hint": "double it"}
            for a in range(8)]
    data = _write_rows(tmp_path / "train.jsonl", rows)
    common = ["--model_name_or_path", "tiny", "--use_cpu", "true", "--bf16", "false", "--per_device_train_batch_size",
              "4", "--num_generations", "4", "--max_completion_length", "8", "--max_steps", "1", "--report_to",
              "none", "--save_strategy", "no", "--dataset_name", data]
    cli.main(["train", "--method", "sign", "--output_dir", str(tmp_path / "out"), *common])
    assert '"method": "sign"' in capsys.readouterr().out
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert {"sign", "ppm-trl", "trl"} <= set(card.data.tags)
    assert "Sign-GRPO" in card.text.split("This model was trained with ", 1)[1].split("\n", 1)[0]
    assert "@misc{sign" in card.text

    # The registration's columns reach the CLI's check, before any model is loaded.
    _write_rows(tmp_path / "nohint.jsonl", [{k: v for k, v in row.items() if k != "hint"} for row in rows])
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--method", "sign", "--output_dir", str(tmp_path / "out2"), *common[:-1],
                  str(tmp_path / "nohint.jsonl")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "'hint' (needed by the sign method)" in error
    assert not (tmp_path / "out2" / "initial_tiny_model").exists()  # refused before the model was built


def test_every_registered_trainer_gets_its_card_from_the_registry():
    """The card attributes TRL reads come from the method's record; a composed method names and cites both papers;
    a user's subclass inherits them unless it sets its own."""
    from ppm_trl.trainers.common import registered_model_card

    for method in METHODS.values():
        if method.name == "grpo":
            assert registered_model_card(method.trainer_class()) == {}  # TRL's own card
            continue
        card = registered_model_card(method.trainer_class())
        assert card == method.model_card()
        assert {"trl", "ppm-trl", method.name, *method.parts} <= set(card["_tag_names"])
        for paper in method.papers():
            assert paper.title in card["_paper"]["title"] and paper.bibtex in card["_paper"]["citation"]
    ppm_arg = METHODS["ppm+arg"].model_card()
    assert ppm_arg["_name"] == "PPM-GRPO + ARG" and ppm_arg["_paper"]["id"] == "2609.07303"
    assert ppm_arg["_paper"]["citation"].index("ppm2026") < ppm_arg["_paper"]["citation"].index("wang2026balancing")

    ppm_trainer = METHODS["ppm"].trainer_class()
    plain = type("MyPPM", (ppm_trainer,), {})
    own = type("MyCitedPPM", (ppm_trainer,), {"_paper": {"title": "mine", "id": None, "citation": "@misc{mine}"}})
    assert registered_model_card(plain) == METHODS["ppm"].model_card()
    assert set(registered_model_card(own)) == {"_name", "_tag_names"}  # its own `_paper` stays


def test_column_needs_come_from_the_registry_for_each_config():
    from types import SimpleNamespace

    from ppm_trl.columns import required_run_columns

    judge = SimpleNamespace(progress_scorer="judge", process_scorer="judge")
    programmatic = SimpleNamespace(progress_scorer="programmatic", process_scorer="programmatic")
    assert set(get_method("ppm").required_columns(judge)) == {"reasoning_points"}
    assert set(get_method("ppm").required_columns(programmatic)) == {"reasoning_points", "env"}
    assert get_method("ppm").required_columns(programmatic, custom_scorer=True) == {}
    assert set(get_method("papo").required_columns(judge)) == {"reference"}
    assert get_method("papo").required_columns(judge)["reference"].kind == "str"
    assert get_method("papo").required_columns(programmatic, custom_scorer=True) == {}
    # A composed method reads what each part reads, for its config.
    assert set(get_method("ppm+arg").required_columns(judge)) == {"reasoning_points", "reference"}
    assert set(get_method("papo+arg").required_columns(programmatic)) == {"reasoning_points", "env", "reference"}
    assert set(required_run_columns("papo+arg", ["accuracy"], judge)) == {"prompt", "answer", "reference"}
    with pytest.raises(ValueError, match="joins unregistered method"):
        register_method(Method("ppm+nope", "ppm_trl.configs:PPMConfig", "x:Y", parts=("ppm", "nope")))


def test_ppm_trainer_refuses_data_its_configured_scorer_cannot_read():
    """The trainer checks the registry's columns for its config: the programmatic scorer reads `env`."""
    from datasets import Dataset

    from ppm_trl import PPMConfig, PPMGRPOTrainer
    from ppm_trl.rewards import accuracy_reward

    data = Dataset.from_dict({"prompt": ["1+1?"] * 2, "answer": ["2"] * 2, "reasoning_points": [["2"]] * 2})
    args = PPMConfig(output_dir="unused", use_cpu=True, bf16=False, per_device_train_batch_size=2,
                     num_generations=2, report_to="none")
    with pytest.raises(ValueError, match="programmatic progress scorer .* needs the `env` column"):
        PPMGRPOTrainer(model="tiny", reward_funcs=accuracy_reward, args=args, train_dataset=data)


def test_reward_registry_names_functions_and_columns(monkeypatch):
    import functools

    from datasets import Dataset

    from ppm_trl import rewards
    from ppm_trl.trainers.common import check_reward_columns

    for reward in REWARDS.values():
        assert reward_of_function(reward.load()) is reward
    assert get_reward("env_point_fraction").columns == ("env", "reasoning_points")

    data = Dataset.from_dict({"prompt": ["x"], "env": ["{}"]})
    wrapped = functools.wraps(rewards.accuracy_reward)(lambda completions, **kw: rewards.accuracy_reward(completions,
                                                                                                         **kw))
    with pytest.raises(ValueError, match="needs the `answer` column"):
        check_reward_columns(data, [rewards.env_outcome_reward, wrapped], "PPM")

    def accuracy_reward(completions, **kwargs):  # a user's own function of the same name: not ours to check
        return [0.0] * len(completions)

    check_reward_columns(data, [accuracy_reward], "PPM")

    # A registered reward is a `--reward_funcs` name of the CLI, with its columns checked up front.
    monkeypatch.setitem(REWARDS, "length", Reward("length", "ppm_trl.text:completion_text", ("length_limit",)))
    script = TrainScriptArguments(method="grpo", reward_funcs=["accuracy", "length"])
    assert reward_names(script) == ["accuracy", "length"]
    with pytest.raises(UsageError, match="'length_limit' \\(needed by the `length` reward\\)"):
        prepare_dataset(script, None, Dataset.from_dict({"prompt": ["x"], "answer": ["1"]}), ["length"], "data")
