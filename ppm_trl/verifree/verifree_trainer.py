"""VerifreeTrainer: GRPO whose reward adds the policy's likelihood of the reference answer (PPM paper App. B.1, eq. 110).

One hook of the base trainer (`ppm_trl.trainers.base`, the seam with TRL): `compute_advantages(batch)` cuts each of
this process's completions before its final output (`likelihood.split_rollout`), appends the reference's final
output (`likelihood.reference_final_output`), reads the mean log-likelihood of those reference tokens under the
current policy (`sequence_logprobs`: one no-grad forward, temperature-scaled as sampling is), gathers
r_vf = exp(mean) to (B,), and returns TRL's group normalisation (`scale_rewards`) of outcome + w · r_vf. A row with
no outcome (every reward function returned None) gets no advantage (NaN → 0), as everywhere.
"""

from __future__ import annotations

import torch

from ..advantages import group_normalize
from ..text import completion_text
from ..trainers.base import Advantages, MethodTrainer
from ..trainers.common import check_method_columns, refuse_environment_owned_data
from .likelihood import likelihood_reward, reference_final_output, split_rollout
from .verifree_config import VerifreeConfig


class VerifreeTrainer(MethodTrainer):
    """GRPO with reward = outcome + `verifree_weight` · exp((1/L) Σ_t log π_θ(x^ref_t | prompt, reasoning, x^ref_<t)).

    Args: `GRPOTrainer`'s; without `args`, `VerifreeConfig("<model name>-VERIFREE")`. The dataset needs a
    `reference` column (and `answer` for a reference without a final output).
    """

    def __init__(self, model, reward_funcs=None, args: VerifreeConfig | None = None, train_dataset=None, **kwargs):
        if args is None:
            args = self.default_config(model)
        if not isinstance(args, VerifreeConfig):
            raise TypeError(f"VerifreeTrainer needs a VerifreeConfig, got {type(args).__name__}")
        check_method_columns(train_dataset, "verifree", args)
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        refuse_environment_owned_data(train_dataset, "verifree", args, None)  # after TRL's own checks

    def compute_advantages(self, batch):
        rollout = self.current_rollout
        texts = [completion_text(c) for c in batch.completions]
        local = self.reference_likelihoods(rollout.prompt_ids, texts, batch.rows)
        likelihood = self.accelerator.gather(local.to(self.accelerator.device)).cpu().to(batch.outcome.dtype)
        outcome = batch.outcome.cpu()
        reward = outcome + self.args.verifree_weight * likelihood.nan_to_num(0.0)
        advantages = group_normalize(reward, self.num_generations, scale=self.args.scale_rewards)
        self.log_metric("verifree/reference_likelihood", likelihood.nanmean().item())
        self.log_metric("verifree/reward", reward.nanmean().item())
        return Advantages(advantages)

    def reference_likelihoods(self, prompt_ids, texts: list[str], rows: list[dict]) -> torch.Tensor:
        """(B_local,) exp of the mean log π of each row's reference final output after the row's reasoning."""
        reasoning_ids, reference_ids, found = [], [], 0
        encode = self.tokenizer
        for text, row in zip(texts, rows):
            reasoning, cut = split_rollout(text)
            found += cut
            reasoning_ids.append(encode(reasoning, add_special_tokens=False)["input_ids"])
            reference = reference_final_output(str(row["reference"]), row.get("answer"))
            reference_ids.append(encode(reference, add_special_tokens=False)["input_ids"])
        self.log_metric("verifree/final_output_found", found / max(len(texts), 1))
        values = []
        size = self.args.verifree_batch_size
        for start in range(0, len(texts), size):
            chunk = slice(start, start + size)
            contexts = [list(p) + r for p, r in zip(prompt_ids[chunk], reasoning_ids[chunk])]
            logps = self.sequence_logprobs(contexts, reference_ids[chunk])
            width = max(len(lp) for lp in logps)
            padded = torch.zeros(len(logps), width, dtype=torch.float64)
            mask = torch.zeros(len(logps), width)
            for i, lp in enumerate(logps):
                padded[i, : len(lp)], mask[i, : len(lp)] = lp, 1
            values.append(likelihood_reward(padded, mask))
        return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
