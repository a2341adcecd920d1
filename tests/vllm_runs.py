"""One trainer run on the real vLLM engine (CPU, colocate or server mode), recorded to JSON for tests/test_vllm_*.py.

    python tests/vllm_runs.py {ppm,papo,arg} OUT.json [--max-model-len N] [--server-url URL]

A child process per run: vLLM's engine owns process-wide state (torch.distributed, its config), and the CPU GEMM
patch (tests/vllm_cpu.py) must be applied before the engine loads. Records, without asserting anything:
- every request the engine received (`llm.generate` in colocate, the HTTP payload in server mode): prompt lengths,
  max_tokens, and whether it came from ARG's continuation step;
- at each rollout generation, after TRL's weight sync: the log-probs vLLM reports for a fixed token sequence
  (`prompt_logprobs`) and the HF training model's for the same tokens;
- ARG: every inserted row (prefix length, completion ids, the sampling log-probs the row carries) and the
  continuation log-probs vLLM returned;
- the logged metrics.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

PROBE = list(range(40, 80))  # a fixed 40-token sequence (byte tokens) for the weight-sync check


def _digit_reward(completions, **kwargs):
    """A reward that varies between random completions (so advantages, hence the optimizer step, are non-zero)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() or ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]


def _starts_like_reference(completions, reference, **kwargs):
    """ARG verifier for the run: correct iff the completion starts with the reference's first sentence.

    The random tiny model never writes it, so every group fails; continuations from a non-empty prefix start with
    it, so they are accepted and inserted with their vLLM log-probs.
    """
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(t.startswith(r.split("\n")[0])) for t, r in zip(texts, reference)]


def _probe_logprobs(trainer):
    """(vLLM, HF) log-probs of PROBE[1:] given its prefix, with the weights the engine holds now."""
    import torch
    from vllm import SamplingParams

    generation = trainer.vllm_generation
    if generation.mode != "colocate":
        return None
    out = generation.llm.generate([{"prompt_token_ids": PROBE}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                                  use_tqdm=False)
    vllm_values = [out[0].prompt_logprobs[i][token].logprob for i, token in enumerate(PROBE) if i > 0]
    model = trainer.accelerator.unwrap_model(trainer.model)
    with torch.no_grad():
        logits = model(torch.tensor([PROBE], device=trainer.accelerator.device)).logits[0, :-1].double()
    hf_values = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(PROBE[1:])[:, None])[:, 0].tolist()
    return {"vllm": vllm_values, "hf": hf_values}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("method", choices=("ppm", "papo", "arg"))
    parser.add_argument("out")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--server-url", default=None, help="server mode against this vLLM OpenAI server")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from vllm_cpu import patch_cpu_gemm_for_weight_sync, patch_trl_engine_args

    if os.environ.get("PPM_TRL_TEST_SKIP_CPU_PATCH") != "1":  # set only to show that the weight-sync test catches it
        patch_cpu_gemm_for_weight_sync()
    patch_trl_engine_args(dtype="float32", enforce_eager=True)
    from datasets import Dataset
    from helpers import TINY_ARGS

    from ppm_trl.envs import make_dataset
    from ppm_trl.rewards import env_outcome_reward
    from ppm_trl.tiny import VLLM_TINY, save_tiny_model

    workdir = tempfile.mkdtemp(prefix=f"vllm_{args.method}_")
    model_path = os.environ.get("VLLM_TEST_MODEL") or save_tiny_model(os.path.join(workdir, "model"), **VLLM_TINY)
    common = dict(
        output_dir=os.path.join(workdir, "out"), per_device_train_batch_size=8, num_generations=4,
        max_completion_length=32, max_steps=args.steps, learning_rate=1e-2, warmup_steps=0,
        use_vllm=True, vllm_mode="server" if args.server_url else "colocate",
        vllm_importance_sampling_correction=True, vllm_enable_sleep_mode=False,
        vllm_max_model_length=args.max_model_len, **TINY_ARGS,
    )
    if args.server_url:
        common.update(vllm_server_base_url=args.server_url)
    record = {"requests": [], "probes": [], "inserted": [], "continuations": [], "model_path": model_path}
    if args.server_url:
        _tolerate_missing_weight_transfer(record)

    if args.method == "ppm":
        from ppm_trl.ppm.ppm_config import PPMConfig
        from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer

        dataset = make_dataset("multi_countdown", 2, 8, seed=0)
        trainer = PPMGRPOTrainer(model=model_path, reward_funcs=[env_outcome_reward, _digit_reward],
                                 # The random model rarely stops within 32 tokens: PPM's default length filter
                                 # would mask whole steps, leaving no token for the IS metrics to cover.
                                 args=PPMConfig(num_segments=4, progress_scorer="programmatic",
                                                mask_truncated_completions=False, **common),
                                 train_dataset=dataset)
    elif args.method == "papo":
        from ppm_trl.papo.papo_config import PAPOConfig
        from ppm_trl.papo.papo_trainer import PAPOTrainer

        dataset = make_dataset("multi_countdown", 2, 8, seed=0)
        trainer = PAPOTrainer(model=model_path, reward_funcs=[env_outcome_reward, _digit_reward],
                              # correct = digit-rich (the random model never solves the task), so the
                              # outcome advantage, hence the first optimizer step, is non-zero.
                              args=PAPOConfig(correct_threshold=0.05, mask_truncated_completions=False, **common),
                              train_dataset=dataset)
    else:
        from ppm_trl.arg.arg_config import ARGConfig
        from ppm_trl.arg.arg_trainer import ARGTrainer

        reference = "Add them.\nSo $3+4=7$.\n\\boxed{7}"
        dataset = Dataset.from_dict({
            "prompt": [[{"role": "user", "content": f"What is 3+4? (#{i})"}] for i in range(8)],
            "answer": ["7"] * 8, "reference": [reference] * 8,
        })
        trainer = ARGTrainer(model=model_path, reward_funcs=[_starts_like_reference, _digit_reward],
                             args=ARGConfig(arg_num_continuations=3, arg_max_accepted=2, arg_min_continuation_tokens=8,
                                            arg_levels=[1.0, 0.5, 0.25], **common),
                             train_dataset=dataset)
    if os.environ.get("PPM_TRL_TEST_SKIP_SYNC") == "1" or "weight_transfer_error" in record:
        # SKIP_SYNC: set only to show that the weight-sync test catches it. Server mode on CPU: nothing to sync with.
        trainer.vllm_generation.sync_weights = lambda: None
    _spy(trainer, record)
    trainer.train()
    record["log_history"] = trainer.state.log_history
    record["max_model_len"] = getattr(trainer, "_vllm_context", None)
    with open(args.out, "w") as f:
        json.dump(record, f, default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v))


def _tolerate_missing_weight_transfer(record):
    """Server mode on CPU: TRL's weight transfer needs CUDA (every vLLM 0.30 engine: NCCL, CUDA IPC, RDT/NIXL).

    The real `init_communicator` runs and its error is recorded; the run then goes on with generation only (the
    server keeps the initial weights), so generation and ARG's continuation requests are still tested for real.
    """
    from trl.generation.vllm_client import VLLMClient

    init_communicator = VLLMClient.init_communicator

    def recorded(self, device=0):
        try:
            init_communicator(self, device)
        except Exception as error:
            record["weight_transfer_error"] = f"{type(error).__name__}: {error}"

    VLLMClient.init_communicator = recorded


def _spy(trainer, record):
    """Record engine requests, weight-sync probes and (ARG) inserted rows; behaviour is unchanged."""
    generation = trainer.vllm_generation
    state = {"continuation": False}

    if generation.mode == "colocate":
        llm_generate = generation.llm.generate

        def engine_generate(prompts, sampling_params=None, **kwargs):
            if sampling_params is not None and sampling_params.prompt_logprobs is None:  # not a probe
                record["requests"].append({
                    "prompt_lens": [len(p["prompt_token_ids"]) for p in prompts],
                    "max_tokens": sampling_params.max_tokens, "continuation": state["continuation"],
                })
            return llm_generate(prompts, sampling_params=sampling_params, **kwargs)

        generation.llm.generate = engine_generate
    else:
        client = generation.vllm_client
        client_generate = client.generate

        def server_generate(prompts, **kwargs):
            record["requests"].append({"prompt_lens": [len(p) for p in prompts], "max_tokens": kwargs["max_tokens"],
                                       "continuation": state["continuation"]})
            try:
                return client_generate(prompts=prompts, **kwargs)
            except Exception as error:
                record["requests"][-1]["error"] = f"{type(error).__name__}: {error}"[:500]
                raise

        client.generate = server_generate

    single_turn = trainer.sample_completion_ids  # the base's generation backend: rollouts and ARG's continuations

    def generate_single_turn(prompt_ids, *args, **kwargs):
        ids, logprobs = single_turn(prompt_ids, *args, **kwargs)  # TRL syncs the weights first when the step moved
        if state["continuation"]:
            record["continuations"].append({"prompts": [list(p) for p in prompt_ids], "ids": [list(i) for i in ids],
                                            "logprobs": logprobs})
        else:
            record["probes"].append({"step": trainer.state.global_step, **(_probe_logprobs(trainer) or {})})
        return ids, logprobs

    trainer.sample_completion_ids = generate_single_turn

    if hasattr(trainer, "_continue_and_verify"):
        continue_and_verify = trainer._continue_and_verify

        def flagged(*args, **kwargs):
            state["continuation"] = True
            try:
                return continue_and_verify(*args, **kwargs)
            finally:
                state["continuation"] = False

        trainer._continue_and_verify = flagged
        accept_and_replace = trainer._accept_and_replace

        def recorded(groups, references, plans, continuations, rollout):
            before = [list(ids) for ids in rollout.completion_ids]
            outcomes, replacements = accept_and_replace(groups, references, plans, continuations, rollout)
            for row, ids in enumerate(rollout.completion_ids):
                if list(ids) != before[row]:
                    index = next(i for i, g in enumerate(groups)
                                 if g.first_row <= row < g.first_row + trainer.num_generations)
                    # continuations[index][i]: a GeneratedCandidate (verified continuation, trajectory)
                    accepted = [continuations[index][i].verified for i in outcomes[index].accepted
                                if list(continuations[index][i].trajectory.completion_ids) == list(ids)]
                    record["inserted"].append({
                        "row": row, "ids": list(ids),
                        "logprobs": None if rollout.logprobs is None else rollout.logprobs[row],
                        "prefix_len": accepted[0].prefix.prefix_len if accepted else None,
                        "fallback": not accepted,
                    })
            return outcomes, replacements

        trainer._accept_and_replace = recorded


if __name__ == "__main__":
    main()
