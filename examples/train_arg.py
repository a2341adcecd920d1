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

import json

from trl import ModelConfig, TrlParser

from ppm_trl.cli import TrainScriptArguments, build_trainer
from ppm_trl.configs import ARGConfig

METHOD = "arg"


def main(argv: list[str] | None = None) -> None:
    parser = TrlParser((TrainScriptArguments, ARGConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    if script_args.method not in ("grpo", METHOD):  # "grpo" is the field's default: not set by the user
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
    """Steps, per-step wall time, ARG's guidance counts and the final selector, for logs and benchmarks."""
    import torch

    history = trainer.state.log_history
    step_times = [entry["step_time"] for entry in history if "step_time" in entry]
    guidance = {name: sum(entry.get(f"arg/{name}", 0.0) for entry in history)
                for name in ("all_failure_groups", "groups_with_accepted", "fallback_groups", "inserted_rows")}
    selector = trainer.prefix_selector
    summary = {"method": METHOD, "steps": result.global_step, "train_loss": result.training_loss,
               "train_runtime_s": result.metrics.get("train_runtime"), "step_time_s": step_times,
               "guidance_totals": guidance,
               "selector_probs": dict(zip(map(str, selector.levels), selector.probs().tolist())),
               "output_dir": trainer.args.output_dir}
    if torch.cuda.is_available():
        summary["peak_torch_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return summary


if __name__ == "__main__":
    main()
