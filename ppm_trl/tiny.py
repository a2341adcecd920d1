"""Offline tiny model and tokenizer for tests, the demo and benchmarks (no Hub access).

The model is a real Qwen2 causal LM built from a config; the tokenizer is a real fast byte-level tokenizer
built with the `tokenizers` library (256 byte tokens, no merges) plus Qwen-style chat special tokens. Both
round-trip through `save_pretrained` / `from_pretrained`, so everything that loads a model by path works on them.
"""

from __future__ import annotations

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen-style template. `{% generation %}` marks assistant tokens so SFTTrainer's `assistant_only_loss` works.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}\n"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer():
    """A byte-level fast tokenizer: every string is encodable, decoding is exact."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=byte_vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model_and_tokenizer(
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
):
    """Build a small Qwen2ForCausalLM and its byte-level tokenizer, deterministically from `seed`.

    The defaults (~0.1M parameters) make a GRPO step on CPU take well under a second; raise `hidden_size` /
    `num_hidden_layers` for the learning demo.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model, tokenizer


def save_tiny_model(path: str, seed: int = 0, **kwargs) -> str:
    """Build the tiny model and tokenizer and save both to `path` (a directory usable as `model_name_or_path`)."""
    model, tokenizer = build_tiny_model_and_tokenizer(seed=seed, **kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
