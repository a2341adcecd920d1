"""The script tests/trainers/test_distributed.py launches on 2 CPU processes (DDP/gloo or DeepSpeed ZeRO-3), and runs in-process
for the one-process reference.

    accelerate launch --config_file configs/accelerate/cpu_zero3.yaml tests/dist_train_script.py \
        --out DIR --jobs real:ppm,real:papo,scripted:ppm:2

Jobs run one after another in the same processes (imports are most of the cost), and each rank writes
`DIR/<job>.rank<r>.json`:
* `real:<method>`: 2 optimizer steps with real HF generation on the tiny model. A callback records after every step
  how many parameters are partitioned (`numel() == 0` locally, `ds_numel > 0`); with `--expect_sharded` (ZeRO-3 with
  `stage3_param_persistence_threshold: 0`) it asserts that EVERY parameter is, so generation (TRL's gathering),
  ARG's surprisal forward and continuations, and the loss all ran on sharded parameters.
* `vllm:<method>`: the same with vLLM colocate generation (GPU only).
* `scripted:<method>:<per_device_batch>`: 1 step whose completions are scripted by the row's position in its group
  (so any process layout sees the same global batch), with a deterministic scorer; dumps every row's advantages
  under its GLOBAL row index, to compare against one process (`per_device_batch` 2 with G = 4 on 2 processes puts
  one group across both ranks).
A job that fails raises: the launcher then stops every rank (a caught error would leave the other rank waiting in a
collective).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

G = 4  # generations per prompt in every job
REAL_STEPS = 2
# Each single method of the registry (`ppm_trl.methods`) with its settings in these tests and the keyword its
# scorer goes to: tests/trainers/test_distributed.py checks that every registered method has an entry, so a new
# registration is trained under DDP and ZeRO-3 (or fails there until it is given settings).
METHOD_SETTINGS = {
    "ppm": (dict(num_segments=4, learning_rate=1e-4), "progress_scorer"),
    "papo": (dict(learning_rate=1e-4), "process_scorer"),
    # G = 4: at most 2 of 4 rows replaced (paper: 4 of 8), 4 continuations per all-failure group.
    "arg": (dict(learning_rate=1e-4, arg_num_continuations=4, arg_max_accepted=2, arg_max_empty_prefix=2), None),
    "verifree": (dict(learning_rate=1e-4), None),  # its likelihood forward runs on the (sharded) policy
    "opsd": (dict(learning_rate=1e-4), None),  # a frozen teacher beside the policy, sharded like it under ZeRO-3
}
METHODS = tuple(METHOD_SETTINGS)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _common_args(output_dir: str, per_device: int, max_steps: int, max_completion_length: int) -> dict:
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"  # set by accelerate launch
    cuda = torch.cuda.is_available()
    return dict(
        output_dir=output_dir,
        # DDP on CPU needs `use_cpu` (accelerate then picks MULTI_CPU + gloo); DeepSpeed must NOT have it (the Trainer
        # would size the DeepSpeed batch for one process) and falls back to CPU by itself.
        use_cpu=not cuda and not deepspeed,
        ddp_backend="gloo" if _world_size() > 1 and not cuda else None,
        bf16=cuda,
        gradient_checkpointing=False,
        per_device_train_batch_size=per_device,
        num_generations=G,
        max_completion_length=max_completion_length,
        max_steps=max_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def build(method: str, output_dir: str, per_device: int, max_steps: int, max_completion_length: int,
          scorer=None, reward=None, env_n: int = 2, dataset_size: int = 16, vllm: bool = False):
    """A trainer of `method` on the tiny model and the multi_countdown env (env outcome reward by default).

    `vllm`: generate with vLLM colocate (sleep mode, small memory share); vLLM loads the model by path, so the tiny
    model is saved first, with 64-dim heads (vLLM's attention kernels do not take the default 16).
    """
    from ppm_trl.envs import make_dataset
    from ppm_trl.rewards import env_outcome_reward
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    args = _common_args(output_dir, per_device, max_steps, max_completion_length)
    dataset = make_dataset("multi_countdown", env_n, dataset_size, seed=0)
    if vllm:  # bf16 on disk: vLLM takes the dtype from the checkpoint, and its fast kernels need half precision
        model, tokenizer = build_tiny_model_and_tokenizer(seed=0, hidden_size=256, num_attention_heads=4,
                                                          num_key_value_heads=2)
        path = os.path.join(output_dir, "initial_model")
        model.to(torch.bfloat16).save_pretrained(path)
        tokenizer.save_pretrained(path)
        model = path
        args.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.15,
                    vllm_enable_sleep_mode=True)
    else:
        model, tokenizer = build_tiny_model_and_tokenizer(seed=0)
    kwargs = dict(model=model, processing_class=tokenizer, reward_funcs=reward or env_outcome_reward,
                  train_dataset=dataset)
    if method not in METHOD_SETTINGS:
        raise ValueError(f"unknown method {method!r}; accepted: {', '.join(METHODS)}")
    from ppm_trl.registry import get_method

    registered, (settings, scorer_keyword) = get_method(method), METHOD_SETTINGS[method]
    config = registered.config_class()(**settings, **args)
    scorer_kwargs = {scorer_keyword: scorer} if scorer_keyword else {}
    return registered.trainer_class()(args=config, **scorer_kwargs, **kwargs), dataset



# ----------------------------------------------------------------------------------------------- instrumentation
def capture_outputs(trainer) -> list[dict]:
    """Record (a detached copy of) every dict `_generate_and_score_completions` returns, before TRL shuffles it."""
    outputs = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        outputs.append({k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = spy
    return outputs


def partition_report(module) -> dict:
    """How many parameters DeepSpeed ZeRO-3 has sharded away from this rank (numel 0 here, ds_numel > 0)."""
    params = list(module.parameters())
    sharded = [p for p in params if hasattr(p, "ds_numel") and p.numel() == 0 and p.ds_numel > 0]
    return {"params": len(params), "sharded": len(sharded), "ds_numel": int(sum(p.ds_numel for p in sharded))}


def _partition_callback(trainer, reports: list, expect_sharded: bool):
    from transformers import TrainerCallback

    class PartitionProbe(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            report = {"step": state.global_step, **partition_report(trainer.model)}
            reports.append(report)
            if expect_sharded and not report["sharded"] == report["params"] > 0:
                raise AssertionError(f"ZeRO-3 left parameters whole on this rank: {report}")

    return PartitionProbe()


def completion_for_position(reference: str, position: int) -> str:
    """The scripted completion of group member `position` (0..G-1) for a multi_countdown problem."""
    first_line = reference.split("\n")[0] + "\n"
    return {
        0: reference,  # correct, every point
        1: first_line,  # point 1 only, incorrect
        2: "Let me solve.\n" + reference,  # correct, every point
        3: "no idea",  # nothing
    }[position % G]


def script_by_group_position(trainer, dataset) -> None:
    """Replace generation: a row's completion depends only on its prompt and its GLOBAL position in the batch."""
    tokenizer = trainer.processing_class
    references = {row["prompt"][0]["content"]: row["reference"] for row in dataset}

    def reference_of(prompt_text: str) -> str:
        matches = [ref for content, ref in references.items() if content in prompt_text]
        if len(matches) != 1:
            raise AssertionError(f"prompt matches {len(matches)} dataset rows: {prompt_text[:80]!r}")
        return matches[0]

    def scripted(prompt_ids, images=None, multimodal_fields=None, num_generations=1, has_tool_images=False):
        first_global_row = trainer.accelerator.process_index * len(prompt_ids)
        completions = []
        for index, ids in enumerate(prompt_ids):
            text = completion_for_position(reference_of(tokenizer.decode(ids)), first_global_row + index)
            completions.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return completions, None

    trainer.sample_completion_ids = scripted


def process_score(rows, texts) -> list[float]:
    """Deterministic PAPO process scorer: a correct response that rambles first gets half credit."""
    return [0.5 if text.startswith("Let me") else 1.0 for text in texts]


# The untrained tiny model never solves a task, so with the env's own scores every advantage of a real run would be
# 0 and nothing would train. These give sampled text a varied (deterministic) score instead; ARG keeps the env
# reward: all-failure groups are exactly what triggers its surprisal pass and continuations.
def distinct_bytes_progress(rows, texts) -> torch.Tensor:
    """PPM progress m_k: distinct characters in prefix k / 32 (grows with the prefix, in [0, 1])."""
    return torch.tensor([[min(1.0, len(set(text)) / 32) for text in prefixes] for prefixes in texts])


def distinct_bytes_process(rows, texts) -> list[float]:
    return [min(1.0, len(set(text)) / 32) for text in texts]


def parity_outcome_reward(completions, **kwargs) -> list[float]:
    """A coin-flip-like outcome: 1 when the completion has an even number of distinct characters."""
    return [float(len(set(c[0]["content"])) % 2 == 0) for c in completions]


REAL_RUN_SCORING = {
    "ppm": dict(scorer=distinct_bytes_progress),
    "papo": dict(scorer=distinct_bytes_process, reward=parity_outcome_reward),
    "arg": {},
    "verifree": {},  # the likelihood of the reference answer separates rollouts the outcome does not
    "opsd": {},  # no reward enters its loss: the teacher's distribution does
}


# ------------------------------------------------------------------------------------------------------ jobs
def run_real(method: str, out_dir: str, vllm: bool = False, expect_sharded: bool = False) -> dict:
    length = 64 if method == "arg" else 32  # ARG's fallback reference (~50 tokens) must fit the budget
    name = f"{'vllm' if vllm else 'real'}_{method}"
    trainer, _ = build(method, os.path.join(out_dir, name), per_device=G, max_steps=REAL_STEPS,
                       max_completion_length=length, vllm=vllm, **REAL_RUN_SCORING[method])
    outputs = capture_outputs(trainer)
    partitions: list[dict] = []
    trainer.add_callback(_partition_callback(trainer, partitions, expect_sharded))
    result = trainer.train()
    advantages = [out["advantages"] for out in outputs]
    metrics: dict[str, list[float]] = {}
    for entry in trainer.state.log_history:
        for key, value in entry.items():
            if key.startswith(("arg/", "ppm/", "papo/")) and isinstance(value, (int, float)):
                metrics.setdefault(key, []).append(value)
    return {
        "global_step": result.global_step,
        "train_loss": result.training_loss,
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "grad_norms": [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e],
        "deepspeed": trainer.is_deepspeed_enabled,
        "num_processes": trainer.accelerator.num_processes,
        "device": str(trainer.accelerator.device),
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "step_times": [e["step_time"] for e in trainer.state.log_history if "step_time" in e],
        "partitions": partitions,
        "advantage_shapes": [list(a.shape) for a in advantages],
        "completion_shapes": [list(out["completion_ids"].shape) for out in outputs],
        "advantages_finite": all(bool(torch.isfinite(a).all()) for a in advantages),
        "metrics": metrics,
        "first_batch": _decoded_rows(trainer, outputs[0]),
    }


def _decoded_rows(trainer, out: dict) -> list[dict]:
    """Prompt, completion and (row-mean) advantage of every local row of one generation batch."""
    tokenizer = trainer.processing_class
    rows = []
    for i in range(out["completion_ids"].shape[0]):
        mask = out["completion_mask"][i].bool()
        advantage = out["advantages"][i]
        rows.append({
            "prompt": tokenizer.decode(out["prompt_ids"][i][out["prompt_mask"][i].bool()], skip_special_tokens=True),
            "completion": tokenizer.decode(out["completion_ids"][i][mask], skip_special_tokens=True),
            # (B,) advantages: the row's value; (B, T): the mean over its loss tokens (None if it has none left)
            "advantage": float(advantage) if advantage.dim() == 0 else
            (float(advantage[mask].mean()) if mask.any() else None),
        })
    return rows


def run_scripted(method: str, per_device: int, out_dir: str) -> dict:
    """One step of scripted completions; every row's advantages (masked tokens only) under its global index."""
    scorer = process_score if method == "papo" else None
    trainer, dataset = build(method, os.path.join(out_dir, f"scripted_{method}_{per_device}"),
                             per_device=per_device, max_steps=1, max_completion_length=64, scorer=scorer)
    script_by_group_position(trainer, dataset)
    outputs = capture_outputs(trainer)
    trainer.train()
    out = outputs[0]
    rank, rows = trainer.accelerator.process_index, out["completion_ids"].shape[0]
    mask = out["completion_mask"].bool() if out["advantages"].dim() == 2 else None
    dumped = {}
    for i in range(rows):
        advantage = out["advantages"][i]
        values = advantage[: int(out["completion_mask"][i].sum())] if mask is not None else advantage.reshape(1)
        ids = out["completion_ids"][i][out["completion_ids"][i] != trainer.processing_class.pad_token_id]
        dumped[str(rank * rows + i)] = {
            "advantages": values.tolist(),
            "advantage_shape": list(advantage.shape),
            "completion": trainer.processing_class.decode(ids, skip_special_tokens=True),
            "prompt": trainer.processing_class.decode(out["prompt_ids"][i], skip_special_tokens=True),
        }
    return {"rows": dumped, "advantages_dim": out["advantages"].dim(), "num_processes": trainer.accelerator.num_processes}


def run_job(job: str, out_dir: str, expect_sharded: bool = False) -> dict:
    parts = job.split(":")
    if parts[0] in ("real", "vllm") and len(parts) == 2:
        return run_real(parts[1], out_dir, vllm=parts[0] == "vllm", expect_sharded=expect_sharded)
    if parts[0] == "scripted" and len(parts) == 3:
        return run_scripted(parts[1], int(parts[2]), out_dir)
    raise ValueError(f"unknown job {job!r}; accepted: real:<method>, vllm:<method>, scripted:<method>:<batch>")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="Directory for the per-rank JSON results.")
    parser.add_argument("--jobs", required=True, help="Comma-separated jobs, run in order.")
    parser.add_argument("--expect_sharded", action="store_true",
                        help="Fail unless ZeRO-3 has partitioned every parameter at every step.")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    for job in args.jobs.split(","):
        result = run_job(job, args.out, expect_sharded=args.expect_sharded)
        path = os.path.join(args.out, f"{job.replace(':', '_')}.rank{rank}.json")
        with open(path, "w") as f:
            json.dump(result, f)
        print(f"dist_train_script: {job} done on rank {rank}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
