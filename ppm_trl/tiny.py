"""Offline tiny model and tokenizer for tests, the demo and benchmarks (no Hub access).

The model is a real Qwen2 causal LM built from a config; the tokenizer is a real fast byte-level tokenizer
built with the `tokenizers` library (256 byte tokens, no merges) plus Qwen-style chat special tokens. Both
round-trip through `save_pretrained` / `from_pretrained`, so everything that loads a model by path works on them.

`tool_calling=True` swaps in a Qwen2.5/Qwen3-style tool template (tool schemas in a system block, calls as
`<tool_call>{json}</tool_call>`, results as `<tool_response>` user turns) and sets the tokenizer's `response_template`,
so TRL's tool/environment loop can render tools and parse the model's calls. A conversation without tools renders
byte-identically under both templates.

`VLLM_TINY` is the smallest shape vLLM's CPU backend loads (its attention kernels reject head_dim 16, the default
model's): hidden 128 with 2 heads, head_dim 64. `save_tiny_model(path, **VLLM_TINY)` writes it for `LLM(model=path)`.
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


# Same rendering as CHAT_TEMPLATE for conversations without tools (transformers renders with trim_blocks, so a
# newline right after a tag is written as {{ '\n' }}). The system block and call format follow Qwen2.5/Qwen3; the
# template is prefix-preserving, as TRL's tool loop requires (it appends tool-result tokens to the rollout).
TOOL_CHAT_TEMPLATE = (
    "{% set ns = namespace(start=0) %}"
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}{{ '\n\n' }}{% set ns.start = 1 %}"
    "{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call>"
    " XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{% endif %}"
    "{% for m in messages[ns.start:] %}"
    "{% if m['role'] == 'assistant' %}"
    "<|im_start|>assistant\n{% generation %}{{ m['content'] or '' }}"
    "{% for call in m['tool_calls'] or [] %}"
    "{% set call = call['function'] if call['function'] is defined else call %}"
    "{% if m['content'] or not loop.first %}{{ '\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ call['name'] }}\", \"arguments\": "
    "{% if call['arguments'] is string %}{{ call['arguments'] }}{% else %}{{ call['arguments'] | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}"
    "<|im_end|>{% endgeneration %}\n"
    "{% elif m['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# transformers' new-style response parser (tokenizer.parse_response), as TRL's `qwen3_template` without the
# <think> field: text up to <|im_end|> is the content, each <tool_call>{json}</tool_call> one call.
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


# vLLM-loadable tiny shape (head_dim = 128 / 2 = 64 ≥ 32, which vLLM's CPU attention needs); ~0.1M parameters more
# than the default, which stays the fast model of the other tests.
VLLM_TINY = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2)


def build_tiny_tokenizer(tool_calling: bool = False):
    """A byte-level fast tokenizer: every string is encodable, decoding is exact.

    `tool_calling=True`: the tool-capable chat template and a `response_template` for parsing tool calls.
    """
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
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE if tool_calling else CHAT_TEMPLATE
    if tool_calling:
        tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    return tokenizer


def build_tiny_model_and_tokenizer(
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    tool_calling: bool = False,
):
    """Build a small Qwen2ForCausalLM and its byte-level tokenizer, deterministically from `seed`.

    The defaults (~0.1M parameters) make a GRPO step on CPU take well under a second; raise `hidden_size` /
    `num_hidden_layers` for the learning demo. `tool_calling=True` gives the tokenizer the tool-calling template
    (same vocabulary, so the model weights do not change).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tiny_tokenizer(tool_calling=tool_calling)
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
