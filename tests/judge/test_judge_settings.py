"""The judge's settings are defined once (issue 31 item 2): `JudgeArguments` checks them when it is built, with the
rules `LiteLLMJudge` checks its own arguments with; `build_judge` is the one way to a judge for `train`, `prepare` and
Python users; `prepare`'s judge flags are made from the same fields (its older flag names kept), and `prepare`
without `--cache-dir` caches the judge's answers like `train` does."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before LiteLLM is imported: no network

import pytest  # noqa: E402

from ppm_trl import cli  # noqa: E402
from ppm_trl.judge import JudgeArguments, LiteLLMJudge, build_judge  # noqa: E402
from ppm_trl.judge.arguments import TRAINING_ONLY  # noqa: E402
from ppm_trl.papo.papo_config import PAPOConfig
from ppm_trl.ppm.ppm_config import PPMConfig

INVALID = [
    ("judge_timeout", -1, "judge_timeout must be a finite number > 0 of seconds"),
    ("judge_timeout", 0, "judge_timeout must be a finite number > 0 of seconds"),
    ("judge_timeout", float("inf"), "judge_timeout must be a finite number > 0 of seconds"),  # was OverflowError
    ("judge_max_rpm", -3, "judge_max_rpm must be a finite number > 0"),
    ("judge_max_tpm", -1.0, "judge_max_tpm must be a finite number > 0"),
    ("judge_max_tpm", 5e-324, "judge_max_tpm must be a finite number > 0 whose reciprocal"),  # 1 / 5e-324 = inf
    ("judge_max_cost_usd", -0.5, "judge_max_cost_usd must be a finite number > 0"),
    ("judge_max_total_tokens", -10, "judge_max_total_tokens must be a finite number > 0"),
    ("judge_max_concurrency", 0, "judge_max_concurrency must be an integer >= 1"),
    ("judge_num_retries", -1, "judge_num_retries must be an integer >= 0"),
    ("judge_burst_seconds", 0, "judge_burst_seconds must be a finite number > 0 of seconds"),
    ("judge_burst_seconds", float("inf"), "judge_burst_seconds must be a finite number > 0"),  # disabled max_rpm
    ("judge_temperature", -0.1, "judge_temperature must be a number >= 0"),
    ("judge_max_response_bytes", 100, "judge_max_response_bytes must be an integer >= 1024"),
    ("judge_transport", "carrier_pigeon", "unknown judge_transport 'carrier_pigeon'"),
    ("judge_model", "", "judge_model must be a LiteLLM model string"),
    ("judge_api_base", "http://user:secret@127.0.0.1:8000/v1", "judge_api_base is refused: it has a user:password@ part"),
    ("judge_max_unscorable_frac", 0, "judge_max_unscorable_frac must be in (0, 1]"),
    ("judge_unscorable_window", 0, "judge_unscorable_window must be an integer >= 1"),
    ("judge_quarantine_after", -1, "judge_quarantine_after must be an integer >= 0"),
    ("judge_echo_nonce", "yes", "judge_echo_nonce must be True or False"),
    ("judge_probe", "no", "judge_probe must be True or False"),
]


def _build(config_class, **settings):
    if config_class is JudgeArguments:
        return JudgeArguments(**settings)
    return config_class(output_dir="/tmp/ppm_trl_judge_settings", use_cpu=True, report_to="none", **settings)


@pytest.mark.parametrize("config_class", [JudgeArguments, PPMConfig, PAPOConfig])
@pytest.mark.parametrize("name,value,message", INVALID)
def test_an_invalid_judge_setting_is_refused_when_built_naming_the_field(config_class, name, value, message):
    with pytest.raises(ValueError) as error:
        _build(config_class, **{name: value})
    assert str(error.value).startswith(message), str(error.value)
    assert "secret" not in str(error.value)


@pytest.mark.parametrize("config_class", [JudgeArguments, PPMConfig, PAPOConfig])
def test_valid_judge_settings_build(config_class):
    config = _build(config_class, judge_timeout=5, judge_max_rpm=600, judge_max_tpm=60_000.0, judge_max_cost_usd=2.5,
                    judge_max_total_tokens=10**6, judge_temperature=0.0)
    assert (config.judge_timeout, config.judge_max_rpm, config.judge_max_cost_usd) == (5, 600, 2.5)
    if config_class is not JudgeArguments:  # the rest of the config's checks still ran after the judge's
        assert config.gradient_accumulation_steps >= 1


def test_one_class_and_the_client_keeps_the_same_rules():
    assert issubclass(PPMConfig, JudgeArguments) and issubclass(PAPOConfig, JudgeArguments)
    with pytest.raises(ValueError, match=r"^timeout must be a finite number > 0 of seconds, got -1"):
        LiteLLMJudge("openai/x", api_base="http://127.0.0.1:9/v1", timeout=-1)
    with pytest.raises(ValueError, match=r"^max_rpm must be a finite number > 0 whose reciprocal is finite too "
                                         r"\(or None: unlimited\), got -3"):
        LiteLLMJudge("openai/x", api_base="http://127.0.0.1:9/v1", max_rpm=-3)


def test_build_judge_caches_in_the_output_dir_unless_told_otherwise(tmp_path):
    config = PPMConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", judge_model="openai/x",
                       judge_api_base="http://127.0.0.1:9/v1", judge_max_rpm=120, judge_echo_nonce=True)
    judge = build_judge(config)
    assert judge.cache_dir == os.path.join(str(tmp_path), "judge_cache")
    assert (judge.model, judge.max_rpm, judge.echo_nonce, judge.timeout) == ("openai/x", 120, True, 60.0)
    assert build_judge(config, "/elsewhere").cache_dir == os.path.join("/elsewhere", "judge_cache")
    assert build_judge(config, cache_dir=None, max_rpm=None).cache_dir is None
    assert build_judge(JudgeArguments(judge_model="openai/x", judge_api_base="http://127.0.0.1:9/v1",
                                      judge_cache_dir=" None "), str(tmp_path)).cache_dir is None
    assert build_judge(JudgeArguments(judge_model="openai/x", judge_api_base="http://127.0.0.1:9/v1")).cache_dir is None


# `ppm-trl prepare`'s judge flags before they were generated from the fields, and the field each one sets.
OLD_PREPARE_FLAGS = {"--judge-model": "judge_model", "--api-base": "judge_api_base", "--api-key-env": "judge_api_key_env",
                     "--max-concurrency": "judge_max_concurrency", "--timeout": "judge_timeout",
                     "--num-retries": "judge_num_retries", "--temperature": "judge_temperature",
                     "--transport": "judge_transport", "--cache-dir": "judge_cache_dir", "--max-rpm": "judge_max_rpm",
                     "--max-tpm": "judge_max_tpm", "--max-cost-usd": "judge_max_cost_usd",
                     "--max-total-tokens": "judge_max_total_tokens",
                     "--max-response-bytes": "judge_max_response_bytes", "--echo-nonce": "judge_echo_nonce",
                     "--no-judge-probe": "judge_probe"}


def test_prepare_judge_flags_are_the_fields():
    from ppm_trl.prepare import prepare_parser

    parser = prepare_parser()
    actions = parser._option_string_actions
    for spec in dataclasses.fields(JudgeArguments):
        if spec.name not in TRAINING_ONLY:
            assert actions[f"--{spec.name.replace('_', '-')}"].dest == spec.name
    for flag, name in OLD_PREPARE_FLAGS.items():
        assert actions[flag].dest == name, flag
    defaults = parser.parse_args(["--dataset", "d", "--reference-column", "r", "--judge-model", "m", "--out", "o"])
    assert (defaults.judge_timeout, defaults.judge_probe, defaults.judge_cache_dir) == (120.0, True, None)


@pytest.mark.parametrize("flags,expected", [
    (["--timeout", "-1"], "--timeout must be a finite number > 0 of seconds, got -1.0"),
    (["--judge_timeout=-1"], "--timeout must be a finite number > 0 of seconds, got -1.0"),
    (["--max-rpm", "-3"], "--max-rpm must be a finite number > 0"),
    (["--judge-max-cost-usd", "-1"], "--max-cost-usd must be a finite number > 0"),
])
def test_prepare_refuses_an_invalid_judge_setting_before_reading_data(tmp_path, capsys, flags, expected):
    with pytest.raises(SystemExit) as error:
        cli.main(["prepare", "--dataset", str(tmp_path / "missing.jsonl"), "--reference-column", "answer",
                  "--judge-model", "hosted_vllm/x", "--api-base", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "o"),
                  *flags])
    err = capsys.readouterr().err
    assert error.value.code == 2 and f"ppm-trl prepare: error: {expected}" in err, err


class _Built(Exception):
    pass


@pytest.mark.parametrize("cache_flag,expected", [([], "default"), (["--cache-dir", "none"], None),
                                                 (["--cache_dir", "CUSTOM"], "custom")])
def test_prepare_builds_its_judge_with_the_default_cache(tmp_path, monkeypatch, cache_flag, expected):
    """Without --cache-dir the judge caches in <work dir>/judge_cache, as train's does in <output_dir>/judge_cache."""
    from ppm_trl import prepare

    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "1 + 1?", "answer": "One and one.\n#### 2"}) + "\n")
    built = []

    def capture(settings, output_dir=None, **overrides):
        built.append(build_judge(settings, output_dir, **overrides))
        raise _Built

    monkeypatch.setattr(prepare, "build_judge", capture)
    custom = str(tmp_path / "cache")
    flags = [custom if flag == "CUSTOM" else flag for flag in cache_flag]
    with pytest.raises(_Built):
        prepare.main(["--dataset", str(data), "--problem-column", "question", "--reference-column", "answer",
                      "--judge-model", "hosted_vllm/x", "--api-base", "http://127.0.0.1:9/v1",
                      "--out", str(tmp_path / "out"), *flags])
    cache = {"default": str(tmp_path / "out" / "judge_cache"), None: None, "custom": custom}[expected]
    assert built[0].cache_dir == cache
    assert built[0].timeout == 120.0  # prepare's own default


def test_the_client_and_the_config_share_every_default_and_name():
    """One set of judge defaults: each `LiteLLMJudge` keyword's default is the `judge_*` field's, every client
    setting is a field, and `config()` (what a checkpoint and the model card save) names every setting."""
    import dataclasses
    import inspect

    from ppm_trl.judge.settings import CLIENT_SETTINGS

    keywords = inspect.signature(LiteLLMJudge.__init__).parameters
    fields = {spec.name: spec.default for spec in dataclasses.fields(JudgeArguments)}
    assert {f"judge_{name}" for name in CLIENT_SETTINGS} <= set(fields) and set(CLIENT_SETTINGS) <= set(keywords)
    # `model` has no client default (a judge is named), `cache_dir` is resolved from the output dir first
    differ = {name: (keywords[name].default, fields[f"judge_{name}"]) for name in CLIENT_SETTINGS
              if name not in ("model", "cache_dir") and keywords[name].default != fields[f"judge_{name}"]}
    assert differ == {}, f"client default vs JudgeArguments default: {differ}"
    judge = LiteLLMJudge(model="openai/x", api_base="http://127.0.0.1:9/v1", burst_seconds=2.5)
    assert set(CLIENT_SETTINGS) <= set(judge.config()) and judge.config()["burst_seconds"] == 2.5
