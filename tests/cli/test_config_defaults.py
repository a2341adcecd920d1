"""Every config builds from its defaults, in Python as on the command line, and the demo's and benchmarks' runs
resolve to the configs they had (a snapshot), so cached benchmark runs stay comparable."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ppm_trl.train import parse_train_args

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

SNAPSHOT = Path(__file__).resolve().parents[1] / "demo_run_configs.json"
CPU = dict(use_cpu=True, bf16=False)


def _classes():
    from ppm_trl import ARGConfig, PAPOARGConfig, PAPOConfig, PPMARGConfig, PPMConfig

    return (PPMConfig, PAPOConfig, ARGConfig, PPMARGConfig, PAPOARGConfig)


@pytest.mark.parametrize("index", range(5))
def test_every_config_builds_from_output_dir_alone(tmp_path, index):
    cls = _classes()[index]
    config = cls(output_dir=str(tmp_path), **CPU)
    # TRL's own check: each prompt's completions are scored together in one generation batch
    assert config.generation_batch_size % config.num_generations == 0


def test_ppm_defaults_fit_whole_groups_and_say_so(tmp_path, caplog):
    from ppm_trl import PPMConfig

    with caplog.at_level(logging.WARNING, logger="ppm_trl.configs"):
        config = PPMConfig(output_dir=str(tmp_path), **CPU)
    # PPM's 16 generations against TRL's per-device batch of 8: two accumulated batches hold one group
    assert (config.num_generations, config.per_device_train_batch_size) == (16, 8)
    assert (config.gradient_accumulation_steps, config.generation_batch_size) == (2, 16)
    assert "so gradient_accumulation_steps=2" in caplog.text
    # the same rule as `ppm-trl train`, on the same settings

    _, cli_args, _ = parse_train_args(["--method", "ppm", "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert (cli_args.gradient_accumulation_steps, cli_args.generation_batch_size) == (2, 16)


def test_a_batch_that_fits_is_left_at_trls_defaults(tmp_path):
    from ppm_trl import PAPOConfig, PPMConfig

    assert PAPOConfig(output_dir=str(tmp_path), **CPU).gradient_accumulation_steps == 1
    config = PPMConfig(output_dir=str(tmp_path), num_generations=8, **CPU)
    assert (config.gradient_accumulation_steps, config.generation_batch_size) == (1, 8)


def test_more_processes_fit_whole_groups_without_accumulation(tmp_path, monkeypatch):
    from ppm_trl.configs import BATCH_KEYS, fit_generation_batch

    # 8 per device × 2 processes = 16 = one PPM group
    monkeypatch.setenv("WORLD_SIZE", "2")
    given = dict.fromkeys(BATCH_KEYS) | {"num_generations": 16, "per_device_train_batch_size": 8}
    assert fit_generation_batch(given, {}, num_processes=2) == ({}, None)


@pytest.mark.parametrize("setting,fix", [
    (dict(gradient_accumulation_steps=1), "set gradient_accumulation_steps=2, or per_device_train_batch_size=16"),
    (dict(generation_batch_size=24), "set generation_batch_size=16"),
    (dict(steps_per_generation=3), "set steps_per_generation=2"),
])
def test_a_batch_the_user_set_that_cannot_fit_names_both_settings(tmp_path, setting, fix):
    from ppm_trl import PPMConfig

    with pytest.raises(ValueError) as error:
        PPMConfig(output_dir=str(tmp_path), **setting, **CPU)
    message = str(error.value)
    assert next(iter(setting)) in message and "num_generations=16" in message and fix in message


@pytest.mark.parametrize("generations,accepted", [(2, 1), (4, 3), (8, 4), (16, 4)])
def test_arg_max_accepted_follows_num_generations_unless_set(tmp_path, generations, accepted):
    from ppm_trl import ARGConfig

    config = ARGConfig(output_dir=str(tmp_path), num_generations=generations, per_device_train_batch_size=16, **CPU)
    assert config.arg_max_accepted == accepted  # the paper's 4, leaving one original failure in the group


@pytest.mark.parametrize("generations", [2, 8, 16])
def test_the_papers_resampling_baseline_keeps_every_correct_candidate_unless_capped(tmp_path, generations):
    # ARG App. G.2: resampling "retains all correct candidate trajectories" — no cap of 4, no surviving failure.
    from ppm_trl import ARGConfig

    config = ARGConfig(output_dir=str(tmp_path), num_generations=generations, per_device_train_batch_size=16,
                       arg_mode="resampling", **CPU)
    assert (config.arg_max_accepted, config.arg_max_empty_prefix) == (generations, generations)
    capped = ARGConfig(output_dir=str(tmp_path), num_generations=8, arg_mode="resampling", arg_max_accepted=3, **CPU)
    assert (capped.arg_max_accepted, capped.arg_max_empty_prefix) == (3, 3)
    assert ARGConfig(output_dir=str(tmp_path), num_generations=8, **CPU).arg_max_empty_prefix == 4  # ARG: Table 3
    with pytest.raises(ValueError, match=r"must lie in \[1, num_generations = 8\], got 9: with arg_mode=resampling"):
        ARGConfig(output_dir=str(tmp_path), num_generations=8, arg_mode="resampling", arg_max_accepted=9, **CPU)


def test_arg_max_accepted_set_too_high_is_still_an_error(tmp_path):
    from ppm_trl import ARGConfig

    with pytest.raises(ValueError, match=r"arg_max_accepted must lie in \[1, num_generations - 1 = 3\], got 4"):
        ARGConfig(output_dir=str(tmp_path), num_generations=4, arg_max_accepted=4, **CPU)


# ------------------------------------------------------------------- the demo's and the benchmarks' runs
# Two RunSpecs per variant, as `ppm_trl.demo.runs.build_variant_trainer` builds their configs: the default one, and one
# with every knob the evidence benchmark varies (n, lr, seed, steps, evaluation, pass@k) at another budget.
SPECS = {
    "default": ({}, 64),
    "tuned": ({"n": 6, "learning_rate": 3e-5, "seed": 1, "max_steps": 30, "eval_every": 5, "pass_k": 8}, 200),
}
VOLATILE = ("output_dir", "logging_dir")


def resolved_demo_configs() -> dict[str, dict]:
    """{variant/spec: the fields in which its resolved config differs from TRL's GRPOConfig defaults} (JSON)."""
    from trl import GRPOConfig

    from ppm_trl.demo.runs import VARIANTS, RunSpec, _common_args, variant_settings
    from ppm_trl.registry import get_method

    def as_json(config) -> dict:
        values = {k: v for k, v in config.to_dict().items() if k not in VOLATILE}
        return json.loads(json.dumps(values, default=str))

    baseline = as_json(GRPOConfig(output_dir="out", **CPU))
    resolved = {}
    for variant in VARIANTS:
        for name, (extra, budget) in SPECS.items():
            spec = RunSpec(variant=variant, **extra)
            method, settings = variant_settings(spec)
            config = as_json(get_method(method).config_class()(**_common_args(spec, "out", budget, False), **settings))
            resolved[f"{variant}/{name}"] = {k: v for k, v in config.items() if baseline.get(k, object()) != v}
    return resolved


def test_demo_and_benchmark_runs_resolve_to_their_snapshot():
    # Regenerate only on purpose (a change that should change the runs): python -c "import tests.test_config_defaults
    # as t; t.write_snapshot()". Cached benchmark runs were trained with these configs.
    expected = json.loads(SNAPSHOT.read_text())
    resolved = resolved_demo_configs()
    assert resolved.keys() == expected.keys()
    changed = {key: {field: (expected[key].get(field), value.get(field))
                     for field in expected[key].keys() | value.keys() if expected[key].get(field) != value.get(field)}
               for key, value in resolved.items() if value != expected[key]}
    assert not changed, changed


def write_snapshot() -> None:
    SNAPSHOT.write_text(json.dumps(resolved_demo_configs(), indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("index", range(5))
def test_first_positional_argument_is_output_dir_as_in_grpo_config(tmp_path, index):
    # GRPOConfig("out") names the output dir; so must PPMConfig("out") (it once set judge_model instead)
    config = _classes()[index](str(tmp_path / "out"), **CPU)
    assert config.output_dir == str(tmp_path / "out")
