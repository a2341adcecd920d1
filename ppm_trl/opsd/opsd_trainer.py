"""OPSDTrainer: on-policy self-distillation from a fixed teacher (PPM paper App. B.1, eq. 111).

Two hooks of the base trainer (`ppm_trl.trainers.base`, the seam with TRL):
1. `compute_advantages(batch)` returns zero advantages (no policy-gradient term) and, as `Advantages.extra`, each
   local row's teacher prompt — `opsd_teacher_template` with the row's problem and reference, in the chat template —
   left-padded; TRL then shuffles and splits them with the rest of the batch;
2. `method_loss(model, inputs)` replaces TRL's policy loss: the student's logits on [prompt, completion], the
   teacher's (no gradient) on [teacher prompt, completion], the generalized JSD at every completion token
   (`divergence.token_jsd`), averaged over each row's tokens then over rows (the base divides it for gradient
   accumulation as TRL divides its own).
The teacher is the starting policy, fixed: for a LoRA run the policy with its adapter disabled; otherwise a frozen
copy made before TRL wraps the policy (prepared for DeepSpeed like TRL's reference model). Evaluation keeps TRL's loss.
"""

from __future__ import annotations

import copy

import torch

from ..text import problem_text
from ..trainers.base import Advantages, MethodTrainer
from ..trainers.common import check_method_columns, refuse_environment_owned_data
from .divergence import sequence_mean, token_jsd
from .opsd_config import OPSDConfig


class OPSDTrainer(MethodTrainer):
    """GRPO's rollouts, trained with eq. 111: E[(1/T) Σ_t JSD(π_θ0(·|prompt, reference, x_<t) ‖ π_θ(·|prompt, x_<t))].

    Args: `GRPOTrainer`'s; without `args`, `OPSDConfig("<model name>-OPSD")`. The dataset needs `reference`.
    """

    def __init__(self, model, reward_funcs=None, args: OPSDConfig | None = None, train_dataset=None, **kwargs):
        if args is None:
            args = self.default_config(model)
        if not isinstance(args, OPSDConfig):
            raise TypeError(f"OPSDTrainer needs an OPSDConfig, got {type(args).__name__}")
        check_method_columns(train_dataset, "opsd", args)
        # The teacher is the policy as it starts: copied now, before TRL patches and wraps it (a later copy would
        # keep calling the live policy's patched forward).
        lora = kwargs.get("peft_config") is not None or hasattr(model, "peft_config")
        teacher = copy.deepcopy(model) if not lora and not isinstance(model, str) else None
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        refuse_environment_owned_data(train_dataset, "opsd", args, None)  # after TRL's own checks
        if not lora and teacher is None:  # a model path: load it again, as TRL loads its reference model
            from transformers import AutoModelForCausalLM

            teacher = AutoModelForCausalLM.from_pretrained(self.model.config._name_or_path, dtype=self.model.dtype)
        self.teacher_model = None if teacher is None else self.prepare_frozen_model(teacher)

    # ------------------------------------------------------------------------------------------------ hooks
    def compute_advantages(self, batch):
        teacher_prompts = [self._teacher_prompt_ids(row) for row in batch.rows]
        width = max(len(ids) for ids in teacher_prompts)
        pad_id = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in teacher_prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in teacher_prompts], dtype=torch.long)
        return Advantages(torch.zeros_like(batch.outcome), extra={"teacher_prompt_ids": ids,
                                                                  "teacher_prompt_mask": mask})

    def method_loss(self, model, inputs):
        if "teacher_prompt_ids" not in inputs:  # evaluation: TRL's loss
            return None
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        width = completion_ids.size(1)
        student = self._completion_logits(model, inputs["prompt_ids"], inputs["prompt_mask"], completion_ids,
                                          completion_mask)
        with torch.no_grad():
            teacher = self._completion_logits(self.teacher_model, inputs["teacher_prompt_ids"],
                                              inputs["teacher_prompt_mask"], completion_ids, completion_mask)
        per_token = token_jsd(student[:, -width:], teacher[:, -width:], self.args.opsd_beta, self.args.temperature)
        loss = sequence_mean(per_token, mask).mean()
        self.log_metric("opsd/jsd", self.accelerator.gather(loss.detach()).mean().item())
        return loss

    # ---------------------------------------------------------------------------------------------- pieces
    def _teacher_prompt_ids(self, row: dict) -> list[int]:
        text = self.args.opsd_teacher_template.format(problem=problem_text(row), reference=row["reference"])
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return self.tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def _completion_logits(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask):
        """(B, T, V) next-token logits at each completion position (the position before each completion token)."""
        if model is None:  # LoRA: the starting policy is the policy with its adapter disabled
            unwrapped = self.accelerator.unwrap_model(self.model)
            with unwrapped.disable_adapter():
                return self._completion_logits(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return logits[:, -completion_ids.size(1) - 1 : -1].float()
