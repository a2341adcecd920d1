"""Train with plain GRPO (the baseline, TRL's own trainer) on the same data and rewards; for `accelerate launch`.

    # CPU, tiny offline model, seconds:
    python examples/train_grpo.py --config configs/grpo_tiny_countdown.yaml
    # one 24 GB GPU, Qwen3-1.7B + LoRA + vLLM colocate:
    accelerate launch --config_file configs/accelerate/single_gpu.yaml examples/train_grpo.py \
        --config configs/lora_24gb_grpo.yaml
    # several GPUs, ZeRO-3:
    accelerate launch --config_file configs/accelerate/zero3.yaml examples/train_grpo.py --config ... --use_vllm true

Every field of `TrainScriptArguments` (data, rewards), TRL's `GRPOConfig` and TRL's
`ModelConfig` (model, `--use_peft --lora_r ...`) is a YAML key and a `--flag`; flags override the YAML.
"""

from __future__ import annotations

import json

from trl import GRPOConfig, ModelConfig, TrlParser

from ppm_trl.cli import TrainScriptArguments, build_trainer

METHOD = "grpo"


def main(argv: list[str] | None = None) -> None:
    parser = TrlParser((TrainScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if script_args.method != METHOD:
        raise SystemExit(f"train_{METHOD}.py trains `{METHOD}`, but the config says method: {script_args.method}")
    script_args.method = METHOD

    trainer = build_trainer(script_args, training_args, model_args)
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name or script_args.env_name)
    if trainer.accelerator.is_main_process:
        print(f"train_{METHOD}: done " + json.dumps(run_summary(trainer, result)), flush=True)


def run_summary(trainer, result) -> dict:
    """Steps, per-step wall time (TRL's `step_time` metric) and peak GPU memory, for logs and benchmarks."""
    import torch

    step_times = [entry["step_time"] for entry in trainer.state.log_history if "step_time" in entry]
    summary = {"method": METHOD, "steps": result.global_step, "train_loss": result.training_loss,
               "train_runtime_s": result.metrics.get("train_runtime"), "step_time_s": step_times,
               "output_dir": trainer.args.output_dir}
    if torch.cuda.is_available():
        summary["peak_torch_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return summary


if __name__ == "__main__":
    main()
