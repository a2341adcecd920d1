"""What a saved run records in its model card (dataset, rewards, method settings, judge model, a real licence), and
what `ppm-trl eval` reads back from it (the trained completion length), with `--max_problems`."""

from __future__ import annotations

import json

import pytest

from ppm_trl.train import build_trainer, parse_train_args

COMMON = dict(use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4, max_completion_length=16,
              max_steps=1, report_to="none", save_strategy="no")


def _card(path):
    from huggingface_hub import ModelCard

    return ModelCard.load(path / "README.md")


def _ppm_trainer(output_dir, model="tiny", **settings):
    from ppm_trl import PPMConfig, PPMGRPOTrainer, make_dataset
    from ppm_trl.rewards import env_outcome_reward, format_reward

    args = PPMConfig(output_dir=str(output_dir), num_segments=2, reward_weights=[1.0, 0.5], **COMMON, **settings)
    return PPMGRPOTrainer(model=model, reward_funcs=[env_outcome_reward, format_reward], args=args,
                         train_dataset=make_dataset("multi_countdown", 2, 4))


def test_card_records_dataset_rewards_settings_and_no_judge(tmp_path):
    trainer = _ppm_trainer(tmp_path / "out")
    trainer.save_model()
    card = _card(tmp_path / "out")
    record = card.data.get("ppm_trl")
    assert record["method"] == "ppm"
    assert "multi_countdown" in record["dataset"] and "n = 2" in record["dataset"]
    assert record["reward_funcs"] == [{"name": "env_outcome_reward", "weight": 1.0},
                                      {"name": "format_reward", "weight": 0.5}]
    assert record["judge_model"] is None
    settings = record["settings"]
    assert settings["num_segments"] == 2 and settings["progress_scorer"] == "programmatic"
    assert settings["max_completion_length"] == 16 and settings["num_generations"] == 4
    assert not any(name.startswith("judge_") for name in settings)  # no judge: its settings say nothing
    # a real licence field instead of TRL's placeholder (`licence: license`)
    assert card.data.license == "unknown" and "licence" not in card.data.to_dict()
    assert "### Training data, rewards and settings" in card.text
    assert "`env_outcome_reward` (weight 1)" in card.text and "Judge model: none" in card.text


def test_card_names_the_judge_model(tmp_path):
    from ppm_trl import PAPOConfig, PAPOTrainer, make_dataset
    from ppm_trl.rewards import env_outcome_reward

    args = PAPOConfig(output_dir=str(tmp_path / "out"), process_scorer="judge", judge_model="hosted_vllm/judge-x",
                      judge_api_base="http://127.0.0.1:9/v1", judge_probe=False, **COMMON)
    trainer = PAPOTrainer(model="tiny", reward_funcs=env_outcome_reward, args=args,
                          train_dataset=make_dataset("multi_countdown", 1, 4))
    trainer.save_model()
    card = _card(tmp_path / "out")
    record = card.data.get("ppm_trl")
    assert record["judge_model"] == "hosted_vllm/judge-x"
    assert record["settings"]["process_scorer"] == "judge" and record["settings"]["judge_model"] == "hosted_vllm/judge-x"
    assert "127.0.0.1:9" not in (tmp_path / "out" / "README.md").read_text()  # nor where the judge runs


def test_card_licence_comes_from_the_base_models_card_unless_set(tmp_path):
    from huggingface_hub import ModelCard, ModelCardData

    from ppm_trl.tiny import save_tiny_model

    base = save_tiny_model(str(tmp_path / "base"))
    ModelCard.from_template(ModelCardData(license="apache-2.0")).save(f"{base}/README.md")
    trainer = _ppm_trainer(tmp_path / "out", model=base)
    trainer.save_model()
    card = _card(tmp_path / "out")
    assert card.data.license == "apache-2.0" and "the base model's card" in card.text
    trainer.create_model_card(license="cc-by-4.0")  # the user's own word wins (CLI: --license)
    assert _card(tmp_path / "out").data.license == "cc-by-4.0"


def test_cli_license_flag_reaches_the_card(tmp_path):

    script, training_args, model_args = parse_train_args([
        "--method", "ppm", "--env_name", "multi_countdown", "--env_n", "1", "--env_size", "4",
        "--model_name_or_path", "tiny", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true",
        "--num_generations", "4", "--per_device_train_batch_size", "4", "--license", "mit"])
    trainer = build_trainer(script, training_args, model_args)
    trainer.save_model()
    assert _card(tmp_path / "out").data.license == "mit"


# ------------------------------------------------------------------------------------------------------ eval
def _eval(tmp_path, model, *extra):
    from ppm_trl import cli

    out = tmp_path / "eval.json"
    report = cli.evaluate(["--model", str(model), "--env", "multi_countdown", "--env_n", "1", "--env_size", "6",
                           "--num_samples", "2", "--k", "1", "--output", str(out), *extra])
    return report, json.loads(out.read_text())


def test_eval_generates_as_long_as_the_model_trained_and_max_problems_limits(tmp_path, monkeypatch):
    from ppm_trl import evaluation

    budgets = []  # the generation budget each eval hands to the sampler
    sample = evaluation.sample_completions
    monkeypatch.setattr(evaluation, "sample_completions",
                        lambda model, tokenizer, prompts, n, max_new_tokens, *rest, **kw:
                        budgets.append(max_new_tokens) or sample(model, tokenizer, prompts, n, max_new_tokens, *rest, **kw))
    trainer = _ppm_trainer(tmp_path / "out")
    trainer.save_model()
    report, written = _eval(tmp_path, tmp_path / "out", "--max_problems", "2")
    assert report["problems"] == 2 and len(written["per_problem"]) == 2  # of 6
    assert report["max_new_tokens"] == 16 and budgets == [16]  # the card's max_completion_length, not eval's 512
    report, _ = _eval(tmp_path, tmp_path / "out", "--max_problems", "1", "--max_new_tokens", "8")
    assert report["max_new_tokens"] == 8 and budgets[-1] == 8  # the flag wins
    # a model without a ppm-trl card (the untrained tiny model) says nothing: eval's default budget applies
    assert evaluation.trained_completion_length(str(tmp_path / "out" / "initial_tiny_model")) is None
    assert evaluation.trained_completion_length("no-such/model") is None


@pytest.mark.parametrize("flag", ["--max_problems", "--max_new_tokens"])
def test_eval_refuses_a_budget_below_one(flag, capsys):
    from ppm_trl import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["eval", "--model", "/nonexistent", "--env", "multi_countdown", flag, "0"])
    assert exit_.value.code == 2 and f"{flag} must be >= 1, got 0" in capsys.readouterr().err
