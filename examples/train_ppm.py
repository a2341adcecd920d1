"""Train with Progressive Point Matching (PPM-GRPO); a script for `accelerate launch`.

    # CPU, tiny offline model, seconds:
    python examples/train_ppm.py --config configs/ppm_tiny_countdown.yaml
    # one 24 GB GPU, Qwen3-1.7B + LoRA + vLLM colocate:
    accelerate launch --config_file configs/accelerate/single_gpu.yaml examples/train_ppm.py \
        --config configs/lora_24gb_ppm.yaml
    # several GPUs, ZeRO-3:
    accelerate launch --config_file configs/accelerate/zero3.yaml examples/train_ppm.py --config ... --use_vllm true

Every field of `TrainScriptArguments` (data, rewards), `PPMConfig` (TRL's `GRPOConfig` + the paper's knobs) and
TRL's `ModelConfig` (model, `--use_peft --lora_r ...`) is a YAML key and a `--flag`; flags override the YAML.
"""

from __future__ import annotations

from ppm_trl.train import run_example


def main(argv: list[str] | None = None) -> dict:
    return run_example("ppm", argv)


if __name__ == "__main__":
    main()
