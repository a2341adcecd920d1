"""Every accelerate config in configs/accelerate goes through accelerate's own loading and launch validation, and
every DeepSpeed JSON through DeepSpeed's and accelerate's parsers, without launching anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

REPO = Path(__file__).resolve().parents[2]
ACCELERATE_DIR = REPO / "configs" / "accelerate"
DEEPSPEED_DIR = REPO / "configs" / "deepspeed"

# name -> (distributed type, processes, machines, ZeRO stage or None, mixed precision)
EXPECTED = {
    "single_gpu.yaml": ("NO", 1, 1, None, "bf16"),
    "multi_gpu.yaml": ("MULTI_GPU", 8, 1, None, "bf16"),
    "zero2.yaml": ("DEEPSPEED", 8, 1, 2, "bf16"),
    "zero3.yaml": ("DEEPSPEED", 8, 1, 3, "bf16"),
    "multi_node_zero3.yaml": ("DEEPSPEED", 16, 2, 3, "bf16"),
    "cpu_ddp.yaml": ("MULTI_GPU", 2, 1, None, "no"),
    "cpu_zero3.yaml": ("DEEPSPEED", 2, 1, 3, "no"),
}


def _validated_launch_args(path: Path):
    """What `accelerate launch --config_file path` resolves before it starts a process."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, mixed_precision_from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # as `launch_command` does before `deepspeed_launcher`
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mixed_precision_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    return args


def _deepspeed_plugin(path: Path):
    """The DeepSpeedPlugin each launched process would build from the launcher's environment."""
    from accelerate.utils import DeepSpeedPlugin, patch_environment
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    _, env = prepare_deepspeed_cmd_env(_validated_launch_args(path))
    with patch_environment(**{k: v for k, v in env.items() if k.startswith("ACCELERATE_")}):
        return DeepSpeedPlugin(), env


def test_every_config_is_covered():
    assert {p.name for p in ACCELERATE_DIR.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_and_validates(name):
    from accelerate.commands.config.config_args import load_config_from_file

    distributed_type, processes, machines, _, mixed_precision = EXPECTED[name]
    config = load_config_from_file(str(ACCELERATE_DIR / name))
    assert str(config.distributed_type).split(".")[-1] == distributed_type
    assert (config.num_processes, config.num_machines) == (processes, machines)
    args = _validated_launch_args(ACCELERATE_DIR / name)
    assert args.mixed_precision == mixed_precision
    assert args.use_deepspeed == (distributed_type == "DEEPSPEED")
    assert args.multi_gpu == (distributed_type == "MULTI_GPU")  # MULTI_GPU → torchrun, also for the CPU test config


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if e[3] is not None))
def test_deepspeed_plugin_builds(name, monkeypatch):
    monkeypatch.chdir(REPO)  # `deepspeed_config_file` is relative to where `accelerate launch` runs
    plugin, env = _deepspeed_plugin(ACCELERATE_DIR / name)
    assert plugin.zero_stage == EXPECTED[name][3]
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == EXPECTED[name][3]
    if plugin.zero_stage == 3:
        assert plugin.zero3_init_flag
        assert plugin.deepspeed_config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"]
    if EXPECTED[name][4] == "bf16":
        assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_cpu_zero3_really_partitions(monkeypatch):
    monkeypatch.chdir(REPO)
    plugin, _ = _deepspeed_plugin(ACCELERATE_DIR / "cpu_zero3.yaml")
    # With DeepSpeed's default threshold (1e5 elements) a tiny model would stay whole on every rank.
    assert plugin.deepspeed_config["zero_optimization"]["stage3_param_persistence_threshold"] == 0


def test_multi_node_config_names_the_main_machine():
    args = _validated_launch_args(ACCELERATE_DIR / "multi_node_zero3.yaml")
    assert args.machine_rank == 0 and args.main_process_ip and args.main_process_port
    assert args.deepspeed_multinode_launcher == "standard"
    assert args.num_processes % args.num_machines == 0


def test_deepspeed_keys_beside_a_json_file_are_refused(tmp_path, monkeypatch):
    """The validation above can fail: accelerate rejects `zero_stage` next to `deepspeed_config_file`."""
    monkeypatch.chdir(REPO)
    bad = (ACCELERATE_DIR / "cpu_zero3.yaml").read_text().replace(
        "  zero3_init_flag: true", "  zero3_init_flag: true\n  zero_stage: 3")
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    with pytest.raises(ValueError, match="deepspeed_config_file"):
        _deepspeed_plugin(path)


@pytest.mark.parametrize("path", sorted(DEEPSPEED_DIR.glob("*.json")), ids=lambda p: p.name)
def test_deepspeed_json_is_valid(path):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from transformers.integrations import HfDeepSpeedConfig

    config = json.loads(path.read_text())
    zero = DeepSpeedZeroConfig(**config["zero_optimization"])  # DeepSpeed's schema: misspelled keys fail
    assert int(zero.stage) == config["zero_optimization"]["stage"]
    # Batch sizes and accumulation are filled by the Trainer from its own arguments, so they cannot disagree.
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        assert config[key] == "auto", key
    assert HfDeepSpeedConfig(str(path)).is_zero3() == (zero.stage == 3)


def test_deepspeed_schema_rejects_a_typo():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    with pytest.raises(Exception, match="persistance"):
        DeepSpeedZeroConfig(stage=3, stage3_param_persistance_threshold=0)


# ------------------------------------------------------------------------ 24 GB LoRA configs (configs/lora_24gb_*)
LORA_24GB = {"ppm": "PPMConfig", "papo": "PAPOConfig", "arg": "ARGConfig", "grpo": "GRPOConfig"}


@pytest.mark.parametrize("method", sorted(LORA_24GB))
def test_lora_24gb_config_parses(method):
    """Every key is a field of the method's config or ModelConfig (TrlParser rejects unknown keys), and the batch
    arithmetic works. `--use_cpu true` only lets `bf16: true` pass on this CUDA-less machine."""
    from ppm_trl.train import parse_train_args

    script, training, model = parse_train_args(["--config", str(REPO / "configs" / f"lora_24gb_{method}.yaml"),
                                                "--use_cpu", "true"])
    assert script.method == method and type(training).__name__ == LORA_24GB[method]
    assert model.model_name_or_path == "Qwen/Qwen3-1.7B" and model.dtype == "bfloat16"
    assert model.use_peft and model.lora_r > 0 and set(model.lora_target_modules) >= {"q_proj", "v_proj"}
    assert training.use_vllm and training.vllm_mode == "colocate" and training.vllm_enable_sleep_mode
    assert 0 < training.vllm_gpu_memory_utilization <= 0.5  # the rest of 24 GB is for training
    assert training.bf16 and training.gradient_checkpointing
    assert training.vllm_max_model_length > training.max_completion_length
    # Groups stay on one process (ARG requires it; cheapest for the others).
    assert (training.per_device_train_batch_size * training.steps_per_generation) % training.num_generations == 0
