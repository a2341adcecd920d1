"""Generation and scoring with the trainer's own backend, for a method that needs more than TRL's rollouts (ARG's
reference surprisal and continuations): completions of given prompt ids with a token budget per row (HF generate,
vLLM colocate or vLLM server, planned so that no request exceeds max_model_len), a no-grad log-prob pass, and
decoding exactly as TRL decodes its own rows.
"""

from __future__ import annotations

import logging

import torch
from accelerate.utils import broadcast_object_list, gather_object
from trl import GRPOTrainer
from trl.chat_template_utils import parse_response
from trl.data_utils import is_conversational
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import pad

logger = logging.getLogger(__name__)


def plan_generation_calls(budgets: list[int], rooms: list[int | None]) -> list[tuple[int, list[int]]]:
    """Group rows into generation calls so that no request asks for more tokens than the engine allows.

    `budgets[i]` is row i's token budget, `rooms[i]` what the engine's max_model_len leaves after its prompt
    (None: no limit, HF generate). A call with max_tokens M serves row i exactly when min(budget, room) ≤ M ≤ room
    (rows are cut to their budget afterwards, the same distribution as stopping there). Returns [(M, rows)]: ONE
    call when every room holds the largest budget (the usual case), else one call per run of rows that fit.
    """
    wanted = [b if r is None else min(b, r) for b, r in zip(budgets, rooms)]
    pending = sorted(range(len(budgets)), key=lambda i: (-wanted[i], i))
    calls = []
    while pending:
        max_tokens = wanted[pending[0]]
        fits = [i for i in pending if rooms[i] is None or rooms[i] >= max_tokens]
        calls.append((max_tokens, sorted(fits)))
        pending = [i for i in pending if i not in set(fits)]
    return calls


class GenerationHelpers:
    """Generation, log-probs and decoding through the trainer's own backend (mixed into `MethodTrainer`)."""

    def sample_completion_ids(self, prompt_ids, images=None, multimodal_fields=None, num_generations=1,
                              has_tool_images=False):
        """The generation backend: completion ids and sampling log-probs (None with HF generate) per prompt."""
        return GRPOTrainer._generate_single_turn(self, prompt_ids, images, multimodal_fields or {}, num_generations,
                                                 has_tool_images)

    def generate_token_ids(self, prompt_ids: list[list[int]], max_tokens: list[int], dummy: list[int]):
        """Completions of text-only `prompt_ids` rows, at most `max_tokens[i]` tokens for row i: (ids, log-probs).

        Rows after the first len(max_tokens) are dummies (padding so that every rank makes the same calls; they get
        empty results with vLLM). A collective: every rank calls it with the same number of rows. HF generate: one
        call of max_completion_length tokens, rows cut to their budget. vLLM: no request asks for more than
        max_model_len − len(prompt) tokens (server mode answers HTTP 400 otherwise); the calls are planned on every
        rank's rows, so each call has the same max_tokens and row count on every rank.
        """
        if not self.use_vllm:
            ids, logprobs = self.sample_completion_ids(prompt_ids)
            cut = list(max_tokens) + [None] * (len(ids) - len(max_tokens))
            ids = [list(row)[:n] for row, n in zip(ids, cut)]
            return ids, None if logprobs is None else [list(row)[:n] for row, n in zip(logprobs, cut)]
        context = self.generation_context_length()
        rank = self.accelerator.process_index
        local = [(rank, i, budget, None if context is None else context - len(prompt_ids[i]))
                 for i, budget in enumerate(max_tokens)]
        everyone = gather_object(local) if self.accelerator.num_processes > 1 else local
        calls = plan_generation_calls([b for *_, b, _ in everyone], [r for *_, r in everyone])
        generated, sampled = [[] for _ in prompt_ids], [[] for _ in prompt_ids]
        generation = self.vllm_generation
        default_max_tokens = generation.max_completion_length
        try:
            for call_max_tokens, members in calls:
                mine = [everyone[j][1] for j in members if everyone[j][0] == rank]
                width = max(sum(everyone[j][0] == r for j in members) for r in range(self.accelerator.num_processes))
                call_rows = [prompt_ids[i] for i in mine] + [dummy] * (width - len(mine))
                generation.max_completion_length = call_max_tokens
                ids, logprobs = self.sample_completion_ids(call_rows)
                for position, i in enumerate(mine):
                    generated[i] = list(ids[position])[: max_tokens[i]]
                    sampled[i] = list(logprobs[position])[: max_tokens[i]]
        finally:
            generation.max_completion_length = default_max_tokens
        return generated, sampled

    def generation_context_length(self) -> int | None:
        """vLLM's max_model_len (prompt + completion tokens of one request), the same on every rank; None for HF."""
        if not self.use_vllm:
            return None
        if getattr(self, "_vllm_context", None) is None:
            if self.vllm_mode == "colocate":
                context = [self.vllm_generation.llm.llm_engine.model_config.max_model_len]
            else:  # only the main process talks to the server
                context = [self.args.vllm_max_model_length]
                if self.accelerator.is_main_process:
                    try:
                        context = [self.vllm_generation.vllm_client.get_server_info()["model_config"]["max_model_len"]]
                    except Exception as error:  # a server without dev endpoints: fall back to the configured value
                        logger.warning("cannot read the vLLM server's max_model_len (%s); using "
                                       "vllm_max_model_length=%s", error, self.args.vllm_max_model_length)
                if self.accelerator.num_processes > 1:
                    broadcast_object_list(context, from_process=0)
            self._vllm_context = context[0]
        return self._vllm_context

    def sequence_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[torch.Tensor]:
        """Per-token log π(c_j | x, c_<j) of each (prompt, completion) row: one batched no-grad forward of the
        current model (temperature-scaled, like sampling); float64 on the CPU, one tensor per row."""
        pad_id, device = self.tokenizer.pad_token_id, self.accelerator.device
        prompts = [torch.tensor(list(p), dtype=torch.long) for p in prompt_ids]
        completions = [torch.tensor(list(c), dtype=torch.long) for c in completion_ids]
        input_ids = torch.cat([pad(prompts, padding_value=pad_id, padding_side="left"),
                               pad(completions, padding_value=pad_id, padding_side="right")], dim=1).to(device)
        attention_mask = torch.cat(
            [pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
             pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right")], dim=1,
        ).to(device)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, max(len(c) for c in completions),
                batch_size=self.args.per_device_train_batch_size,
            )
        return [logps[i, : len(c)].detach().double().cpu() for i, c in enumerate(completion_ids)]

    def decode_completions(self, prompts, prompt_ids, completion_ids) -> list:
        """Completions decoded exactly as TRL's `_generate` decodes its own (conversational or plain text)."""
        if not completion_ids:
            return []
        if is_conversational({"prompt": prompts[0]}):
            if getattr(self.tokenizer, "response_template", None) is not None or getattr(
                self.tokenizer, "response_schema", None
            ) is not None:
                return [[parse_response(self.tokenizer, ids, prefix=list(p), tools=self.tools)]
                        for ids, p in zip(completion_ids, prompt_ids)]
            contents = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
            return [[{"role": "assistant", "content": content}] for content in contents]
        return self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return self.sample_completion_ids(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
