"""Train with ARG (adaptive reference guidance for all-failure groups); a script for `accelerate launch`.

    # CPU, tiny offline model, seconds:
    python examples/train_arg.py --config configs/arg_tiny.yaml
    # one GPU, vLLM colocate (the continuations go through the same engine, in one call per step):
    accelerate launch --config_file configs/accelerate/single_gpu.yaml examples/train_arg.py \
        --config configs/arg_tiny.yaml --model_name_or_path Qwen/Qwen3-1.7B --use_vllm true --use_cpu false
    # several GPUs, ZeRO-3 (every group's rows must sit on one process: per_device_train_batch_size *
    # steps_per_generation must be a multiple of num_generations):
    accelerate launch --config_file configs/accelerate/zero3.yaml examples/train_arg.py --config ...

Every field of `TrainScriptArguments` (data, rewards), `ARGConfig` (TRL's `GRPOConfig` + the paper's knobs) and
TRL's `ModelConfig` (model, `--use_peft --lora_r ...`) is a YAML key and a `--flag`; flags override the YAML.
The dataset needs a `reference` column (a solution ending in the boxed answer). Default rewards: the verifier
(`accuracy`, or `env_outcome` for a synthetic env) + `format`, weighted [1, format_reward_weight] (paper App. E.3).
"""

from __future__ import annotations

from ppm_trl.train import run_example


def main(argv: list[str] | None = None) -> dict:
    return run_example("arg", argv)


if __name__ == "__main__":
    main()
