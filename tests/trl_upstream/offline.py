"""Offline stand-ins for the Hub models and datasets TRL's GRPO tests load (ours, not TRL's; see README.md here).

* Models: `hub_cache(root)` writes tiny local models (`ppm_trl.tiny`) into a Hugging Face cache folder under the
  Hub ids the tests name, so `from_pretrained("trl-internal-testing/tiny-Qwen2ForCausalLM-2.5")` and every other
  loader (TRL's, transformers', the tokenizer's) resolve offline to them. Ids that are not listed here are not in the
  cache: the tests that need them are skipped by conftest.py with the reason.
* Datasets: `load_dataset("trl-internal-testing/zen", ...)` returns rows of our `multi_add` task with zen's `prompt`
  column (standard: text, conversational: one user message) and the columns our methods read (`reference`,
  `reasoning_points`, `reasoning_graph`, `env`, `answer`, ...), in zen's `train` / `test` splits.
* Token ids: TRL's tests script generations as Qwen2.5 token ids; `tiny_ids` encodes the same text with the tiny
  byte-level tokenizer instead.
"""

from __future__ import annotations

import os

import pytest

# Hub id → how to build its stand-in. `causal`: ppm_trl.tiny's Qwen2 causal LM; `reward`: the same tiny shape as a
# one-label sequence classifier (a reward model); `tools`: the tokenizer's tool-calling chat template (the Qwen3 ids
# are the tests' tool/environment models). Different seeds give different weights to different ids.
HUB_MODELS = {
    "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5": dict(kind="causal", seed=0),
    "trl-internal-testing/tiny-Qwen3ForCausalLM": dict(kind="causal", seed=3, tools=True),
    "trl-internal-testing/tiny-Qwen3MoeForCausalLM": dict(kind="causal", seed=4, tools=True),
    "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5": dict(kind="reward", seed=10),
    "trl-internal-testing/tiny-Qwen3ForSequenceClassification": dict(kind="reward", seed=11),
    "trl-internal-testing/tiny-LlamaForSequenceClassification-3.2": dict(kind="reward", seed=12),
}

# The local zen: `multi_add` problems of two sums (a short prompt, a boxed reference, three reasoning points).
ZEN_SPLITS = {"train": dict(size=8, seed=0), "test": dict(size=2, seed=1)}
ZEN_CONFIGS = ("standard_prompt_only", "conversational_prompt_only")
_REVISION = "0" * 40  # the one "commit" of each cached repo


def _build(path: str, kind: str, seed: int, tools: bool = False) -> None:
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    model, tokenizer = build_tiny_model_and_tokenizer(seed=seed, tool_calling=tools)
    if kind == "reward":
        import torch
        from transformers import Qwen2ForSequenceClassification

        config = model.config
        config.num_labels = 1
        config.architectures = ["Qwen2ForSequenceClassification"]
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            model = Qwen2ForSequenceClassification(config)
        finally:
            torch.random.set_rng_state(state)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def hub_cache(root: str) -> str:
    """A Hugging Face hub cache at `root` holding every model of `HUB_MODELS` under its Hub id (offline layout:
    refs/main → snapshots/<revision>/files). Returns `root`."""
    for repo_id, spec in HUB_MODELS.items():
        repo = os.path.join(root, "models--" + repo_id.replace("/", "--"))
        snapshot = os.path.join(repo, "snapshots", _REVISION)
        if os.path.exists(os.path.join(snapshot, "config.json")):
            continue
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        _build(snapshot, **spec)
        with open(os.path.join(repo, "refs", "main"), "w") as handle:
            handle.write(_REVISION)
    return root


def _zen_split(config_name: str, size: int, seed: int):
    from ppm_trl import make_dataset

    dataset = make_dataset("multi_add", n=2, size=size, seed=seed)
    if config_name == "standard_prompt_only":
        prompts = [messages[0]["content"] for messages in dataset["prompt"]]
        dataset = dataset.remove_columns("prompt").add_column("prompt", prompts)
    return dataset


def load_dataset(path, name=None, split=None, streaming=False, **kwargs):
    """`datasets.load_dataset` for the datasets TRL's GRPO tests name, offline (see the module docstring)."""
    from datasets import DatasetDict, IterableDatasetDict

    if path != "trl-internal-testing/zen" or name not in ZEN_CONFIGS or kwargs:
        pytest.skip(f"needs the Hub dataset {path!r} ({name}) (network)")
    splits = DatasetDict({key: _zen_split(name, **spec) for key, spec in ZEN_SPLITS.items()})
    if streaming:
        splits = IterableDatasetDict({key: value.to_iterable_dataset() for key, value in splits.items()})
    return splits if split is None else splits[split]


def _tokenizer():
    from ppm_trl.tiny import build_tiny_tokenizer

    if "tok" not in _tokenizer_cache:
        _tokenizer_cache["tok"] = build_tiny_tokenizer()
    return _tokenizer_cache["tok"]


_tokenizer_cache: dict = {}
TINY_EOS = _tokenizer().eos_token_id  # `<|im_end|>`, Qwen2.5's 151645
TINY_PAD = _tokenizer().pad_token_id  # `<|endoftext|>`, Qwen2.5's 151643


def tiny_ids(texts, device=None):
    """(rows, width) token ids of `texts` in the tiny byte-level tokenizer, right-padded with its pad token.

    TRL's tests script generations as Qwen2.5 token ids (their comments give the text); the tiny models read bytes,
    so the same text is encoded here. `<|im_end|>` (EOS) and `<|endoftext|>` (pad) are the same special tokens."""
    import torch

    tokenizer = _tokenizer()
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    width = max(len(row) for row in rows)
    rows = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]
    return torch.tensor(rows, device=device)


# ------------------------------------------------------------------------ scorers that need no judge and no column
# TRL's tests train a random tiny model against TRL's own reward functions and models; its completions reach none of
# a task's reasoning points, so the built-in programmatic scorers would score every completion 0 and PPM's progress
# and PAPO's A_proc would never move. These score the text itself (deterministic, no column read), so both
# advantages get signal from every batch and the method's own path runs in every test.
class TextProgress:
    """PPM progress scorer: a prefix reaches point k of `points` when it holds ≥ `chars_per_point`·k non-space
    characters (progress = points reached / `points`)."""

    def __init__(self, points: int = 3, chars_per_point: int = 4):
        self.points, self.chars_per_point = points, chars_per_point
        self.calls = 0

    def __call__(self, rows, texts):
        import torch

        self.calls += 1
        return torch.tensor([[min(self.points, len("".join(text.split())) // self.chars_per_point) / self.points
                              for text in row_texts] for row_texts in texts], dtype=torch.float32)


class TextProcess:
    """PAPO process scorer: a hash of the (correct) response's text in [0, 1), 0 for an empty one — any two different
    texts almost surely differ (a share of distinct characters, say, is 1 for every short random completion)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, rows, texts):
        import hashlib

        self.calls += 1
        return [int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16**8 if text else 0.0 for text in texts]
