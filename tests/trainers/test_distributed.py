"""The three trainers on TRL's distributed machinery, on 2 CPU processes: DeepSpeed ZeRO-3 with real partitioning,
plain DDP (gloo), and the same advantages as one process on the same batch, also when a group straddles two ranks.

Each launch (`accelerate launch` of tests/dist_train_script.py) runs all its jobs in the same two processes, because
imports dominate the cost; every test then reads one job's per-rank JSON. The GPU tests at the end (vLLM colocate,
vLLM server, ZeRO-3 on CUDA) are skipped without CUDA (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import dist_train_script
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "accelerate"
# Under `make test`'s two workers a launch takes up to ~100 s (the first ZeRO-3 one compiles DeepSpeed's CPU op for a
# new venv; 2026-12-07) and a test makes two: the bounds stay ≥ 10× that.
LAUNCH_TIMEOUT_S = 1800
pytestmark = pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S)

METHODS = list(dist_train_script.METHODS)  # the registry's single methods (checked below)
SCRIPTED = ["scripted:ppm:4", "scripted:ppm:2", "scripted:papo:2"]
REAL = ["real:ppm", "real:papo", "real:verifree", "real:opsd", "real:arg"]  # ARG last: a crash there keeps the rest


def _free_port() -> int:
    """Other test sessions may be using torchrun's default port 29500."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accelerate_launch() -> list[str]:
    script = Path(sys.executable).with_name("accelerate")
    return [str(script), "launch"] if script.exists() else [sys.executable, "-m", "accelerate.commands.launch"]


def accelerate_launch(config: str, script: list[str], num_processes: int | None = None,
                      env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file configs/accelerate/<config> <script...>` from the repository root; the
    processes import this checkout's ppm_trl (PYTHONPATH), not whichever one is installed."""
    command = _accelerate_launch()
    command += ["--config_file", str(CONFIGS / config), "--main_process_port", str(_free_port())]
    if num_processes is not None:
        command += ["--num_processes", str(num_processes)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **(env or {})}
    return subprocess.run([*command, *script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S)


def launch(config: str, jobs: list[str], out_dir: Path, num_processes: int | None = None,
           expect_sharded: bool = False) -> dict:
    script = ["tests/dist_train_script.py", "--out", str(out_dir), "--jobs", ",".join(jobs)]
    completed = accelerate_launch(config, script + (["--expect_sharded"] if expect_sharded else []), num_processes)
    return {"out": out_dir, "returncode": completed.returncode, "log": completed.stdout + completed.stderr}


def job_result(run: dict, job: str, rank: int) -> dict:
    path = run["out"] / f"{job.replace(':', '_')}.rank{rank}.json"
    if not path.exists():
        log = "\n".join(line for line in run["log"].splitlines() if "Warning" not in line)[-6000:]
        pytest.fail(f"job {job} left no result on rank {rank} (launch exit code {run['returncode']}):\n{log}")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    return launch("cpu_ddp.yaml", SCRIPTED + REAL, tmp_path_factory.mktemp("ddp"))


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory):
    return launch("cpu_zero3.yaml", REAL + ["scripted:ppm:2", "scripted:papo:2"], tmp_path_factory.mktemp("zero3"),
                  expect_sharded=True)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The scripted jobs in this process (one rank), each with the per-device batch of both ranks together."""
    from dist_train_script import run_scripted

    cache = {}

    def run(method: str, per_device: int) -> dict:
        key = (method, per_device)
        if key not in cache:
            cache[key] = run_scripted(method, 2 * per_device, str(tmp_path_factory.mktemp(f"one_{method}")))
        return cache[key]

    return run


def _tiny_parameter_count() -> int:
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    return sum(p.numel() for p in build_tiny_model_and_tokenizer()[0].parameters())


def _check_trained(result: dict, method: str) -> None:
    assert result["num_processes"] == 2
    assert result["global_step"] == 2
    assert result["advantages_finite"]
    assert max(result["grad_norms"]) > 0  # a real training signal went through the (sharded) model
    for advantage_shape, completion_shape in zip(result["advantage_shapes"], result["completion_shapes"]):
        if method == "ppm":
            assert advantage_shape == completion_shape  # (B, T) per-token advantages survived the slicing
        else:
            assert advantage_shape == completion_shape[:1]


def _check_arg_replaced_rows(result: dict) -> None:
    """Every all-failure group got the reference (or an accepted continuation) in place of a failure; on this
    rank's slice the inserted correct row carries GRPO's advantage of one success in four: (1 - 1/4) / 0.5."""
    from ppm_trl.envs import make_dataset

    metrics = result["metrics"]
    assert metrics["arg/all_failure_groups"][0] > 0  # the untrained model fails every group
    assert metrics["arg/continuations"][0] > 0  # continuations were generated (surprisal prefixes, one batched call)
    assert metrics["arg/inserted_rows"][0] > 0
    references = {row["prompt"][0]["content"]: row["reference"] for row in make_dataset("multi_countdown", 2, 16, 0)}
    inserted = [row for row in result["first_batch"]
                if any(content in row["prompt"] and ref.strip() == row["completion"].strip()
                       for content, ref in references.items())]
    assert inserted, "no reference row in this rank's first batch"
    for row in inserted:
        assert row["advantage"] == pytest.approx(1.5, abs=1e-2)


# ------------------------------------------------------------------------------------------------ ZeRO-3 on CPU
@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_zero3_trains_with_every_parameter_sharded(zero3_run, method):
    full_size = _tiny_parameter_count()
    for rank in (0, 1):
        result = job_result(zero3_run, f"real:{method}", rank)
        assert result["deepspeed"]
        _check_trained(result, method)
        assert len(result["partitions"]) == 2  # probed after each optimizer step
        for probe in result["partitions"]:
            assert probe["sharded"] == probe["params"] > 0, probe  # numel() == 0 here for EVERY parameter
            assert probe["ds_numel"] == full_size


@pytest.mark.slow
def test_zero3_arg_surprisal_and_continuations_on_sharded_model(zero3_run):
    for rank in (0, 1):
        _check_arg_replaced_rows(job_result(zero3_run, "real:arg", rank))


# -------------------------------------------------------------------------------------------------- DDP on CPU
@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_ddp_trains(ddp_run, method):
    for rank in (0, 1):
        result = job_result(ddp_run, f"real:{method}", rank)
        assert not result["deepspeed"]
        assert all(probe["sharded"] == 0 for probe in result["partitions"])  # DDP keeps full replicas
        _check_trained(result, method)


@pytest.mark.slow
def test_ddp_arg_replaces_rows_on_the_owning_rank(ddp_run):
    for rank in (0, 1):
        _check_arg_replaced_rows(job_result(ddp_run, "real:arg", rank))


# ------------------------------------------------------------------------- two processes == one process
def _merged(run: dict, job: str) -> dict:
    rows = {}
    for rank in (0, 1):
        result = job_result(run, job, rank)
        assert result["num_processes"] == 2
        rows.update(result["rows"])
    return rows


def _assert_same_advantages(two: dict, one: dict) -> None:
    assert sorted(two, key=int) == sorted(one["rows"], key=int)
    for index, row in one["rows"].items():
        assert two[index]["prompt"] == row["prompt"] and two[index]["completion"] == row["completion"], index
        # (T,) rows padded to each process's own longest completion, or scalars; compared on the loss tokens
        assert len(two[index]["advantage_shape"]) == len(row["advantage_shape"])
        assert torch.allclose(torch.tensor(two[index]["advantages"]), torch.tensor(row["advantages"]), atol=1e-5), (
            index, two[index]["advantages"][:6], row["advantages"][:6])


@pytest.mark.slow
@pytest.mark.parametrize("launch_name, per_device", [("ddp", 4), ("ddp", 2), ("zero3", 2)])
def test_ppm_token_advantages_match_one_process(launch_name, per_device, ddp_run, zero3_run, one_process):
    """Per-device batch 2 with G = 4 puts one group on both ranks: its segment means need the gathered batch."""
    run = {"ddp": ddp_run, "zero3": zero3_run}[launch_name]
    two = _merged(run, f"scripted:ppm:{per_device}")
    one = one_process("ppm", per_device)
    assert one["advantages_dim"] == 2
    _assert_same_advantages(two, one)
    if per_device == 2:  # the straddling layout really straddles: rows 0-1 on rank 0, rows 2-3 on rank 1
        assert len({two[str(i)]["prompt"] for i in range(4)}) == 1
    # Not a trivial agreement: a completion's advantage changes across its segments, and the group's rows differ.
    assert any(len({round(v, 5) for v in row["advantages"]}) > 1 for row in two.values())
    assert len({round(sum(row["advantages"]), 4) for row in two.values()}) > 2


@pytest.mark.slow
@pytest.mark.parametrize("launch_name", ["ddp", "zero3"])
def test_papo_straddling_group_matches_one_process(launch_name, ddp_run, zero3_run, one_process):
    """Group [correct (process 1.0) | wrong] on rank 0, [correct (process 0.5) | wrong] on rank 1.

    A_out = ±0.5/0.57735 (sample std of [1, 0, 1, 0]); A_proc over the correct pair {1.0, 0.5} = ±0.25/0.35355.
    A rank-local correct subset would have |C| = 1 on each rank and A_proc = 0 instead.
    """
    run = {"ddp": ddp_run, "zero3": zero3_run}[launch_name]
    two = _merged(run, "scripted:papo:2")
    _assert_same_advantages(two, one_process("papo", 2))
    a_out, a_proc = 0.5 / 0.57735027, 0.25 / 0.35355339
    expected = [a_out + a_proc, -a_out, a_out - a_proc, -a_out]
    for position in range(4):
        assert two[str(position)]["advantages"] == [pytest.approx(expected[position], abs=1e-4)]


# ------------------------------------------------------------------------- the README's CPU launchers, as written
def readme_launch_lines() -> list[str]:
    """The `accelerate launch` lines of README "GPU quickstart" → "Before renting GPUs" (its second bash block)."""
    from helpers import readme_block

    return [line for line in readme_block("GPU quickstart", "bash", 1).splitlines()
            if line.startswith("accelerate launch")]


def launch_readme_line(line: str, out: Path, *more: str, env: dict | None = None) -> str:
    """One README line as written (its own output_dir redirected to `out`, `more` flags after it); the log."""
    words = line.split()
    config = Path(words[words.index("--config_file") + 1]).name
    script = words[words.index("--config_file") + 2:]
    completed = accelerate_launch(config, [*script, "--output_dir", str(out), *more], env=env)
    log = completed.stdout + completed.stderr
    assert completed.returncode == 0, log[-6000:]
    return log


def test_the_readme_lists_a_cpu_dry_run_of_every_launcher_and_method():
    lines = readme_launch_lines()
    pairs = [(Path(line.split()[3]).name, line.split()[4]) for line in lines]
    assert sorted(pairs) == sorted((config, f"examples/train_{m}.py") for config in ("cpu_ddp.yaml", "cpu_zero3.yaml")
                                   for m in ("ppm", "papo", "arg"))
    assert len(lines) == 6  # what the README launch test parametrizes over


@pytest.mark.slow
@pytest.mark.parametrize("index", range(6))
def test_the_readme_cpu_launch_runs_as_written_then_resumes_in_the_same_output_dir(index, tmp_path):
    """Issue 44: ZeRO-3 on CPU failed 3 of 3 times as a user ran it (both ranks built the tiny model at once; with
    the config's `use_cpu` DeepSpeed asserted on the batch size), and the half-written model broke every rerun.
    Each README line from an empty HOME and output_dir; then the PPM lines and the ZeRO-3 ARG line (whose selector
    state is saved too) again in the same output_dir with `--resume_from_checkpoint last`, one step further, on the
    model the first run built. (The PAPO lines and the DDP ARG line run once: their rerun and resume are the PPM
    line's code path under the same launcher; each launch costs ~30 s of CI.)"""
    line = readme_launch_lines()[index]
    method = line.split()[4].split("_")[-1].removesuffix(".py")
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    empty = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "HF_HOME": str(home / ".cache" / "hf")}
    save = ["--save_strategy", "steps", "--save_steps", "1"]
    log = launch_readme_line(line, out, *save, env=empty)
    assert f"train_{method}: done " in log
    built = out / "initial_tiny_model"
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(os.listdir(built))
    assert not [name for name in os.listdir(out) if name.startswith(".initial_tiny_model")]  # no staging left
    if "cpu_zero3" in line:
        assert "DeepSpeed without CUDA: use_cpu off" in log  # the config's use_cpu, handled and said
    if method == "papo" or (method == "arg" and "cpu_zero3" not in line):
        return
    weights = (built / "model.safetensors").stat().st_mtime_ns
    log = launch_readme_line(line, out, *save, "--max_steps", "3", "--resume_from_checkpoint", "last")
    assert "resuming from checkpoint-2" in log and '"steps": 3' in log
    assert (built / "model.safetensors").stat().st_mtime_ns == weights  # the built model reused, not rebuilt


# ---------------------------------------------------------------------------------------------- examples/
def _example(method: str):
    spec = importlib.util.spec_from_file_location(f"example_train_{method}", REPO / "examples" / f"train_{method}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY_CONFIGS = {"ppm": "ppm_tiny_countdown.yaml", "papo": "papo_tiny_countdown.yaml",
                "grpo": "grpo_tiny_countdown.yaml", "arg": "arg_tiny.yaml"}


@pytest.mark.parametrize("method", ["ppm", "papo", "grpo", "arg"])
def test_example_script_trains_and_saves(method, tmp_path, capsys):
    """The accelerate-launchable scripts, in-process on CPU: parse the tiny YAML + flags, train, save, summarise."""
    budget = [] if method == "arg" else ["--max_completion_length", "16"]  # ARG's references need its 64
    _example(method).main(["--config", str(REPO / "configs" / TINY_CONFIGS[method]), "--max_steps", "1",
                           "--output_dir", str(tmp_path), "--env_size", "8", "--disable_tqdm", "true", *budget])
    done = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"train_{method}: done ")]
    summary = json.loads(done[-1].split(" done ", 1)[1])
    assert summary["method"] == method and summary["steps"] == 1 and len(summary["step_time_s"]) == 1
    assert (tmp_path / "model.safetensors").exists()


def test_example_script_refuses_another_method(tmp_path):
    with pytest.raises(SystemExit, match="trains `papo`"):
        _example("papo").main(["--config", str(REPO / "configs" / "grpo_tiny_countdown.yaml"), "--method", "ppm",
                               "--output_dir", str(tmp_path)])


# ------------------------------------------------------------------------------------------------- GPU only
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


@pytest.mark.gpu
@needs_vllm
@pytest.mark.parametrize("method", METHODS)
def test_vllm_colocate_two_steps(method, tmp_path):
    """One process, vLLM colocate with sleep mode; ARG's continuations go through the same engine."""
    run = launch("single_gpu.yaml", [f"vllm:{method}"], tmp_path)
    result = job_result(run, f"vllm:{method}", 0)
    assert result["global_step"] == 2 and result["advantages_finite"]
    assert result["device"].startswith("cuda")
    if method == "arg":
        assert result["metrics"]["arg/continuations"][0] > 0
    print(f"vllm colocate {method}: step times {result['step_times']}, peak {result['peak_gpu_memory_gib']:.2f} GiB")


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
def test_zero3_on_one_gpu(method, tmp_path):
    """configs/accelerate/zero3.yaml as shipped (bf16, ZeRO-3 init) with HF generation; scripts/gpu_smoke.sh adds
    the ZeRO-3 + vLLM colocate run."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed not installed")
    job = f"real:{method}"
    run = launch("zero3.yaml", [job], tmp_path, num_processes=1)
    result = job_result(run, job, 0)
    assert result["deepspeed"] and result["global_step"] == 2 and result["advantages_finite"]


@pytest.mark.gpu
@needs_vllm
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="vLLM server mode needs a GPU of its own (NCCL weight sync)")
def test_vllm_server_mode(tmp_path):
    """`trl vllm-serve` on GPU 1, the example scripts on GPU 0; ARG's continuations go to the same server."""
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    model_dir = tmp_path / "model"
    model, tokenizer = build_tiny_model_and_tokenizer(hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    model.to(torch.bfloat16).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    trl = shutil.which("trl") or str(Path(sys.executable).with_name("trl"))
    port = _free_port()
    server = subprocess.Popen(
        [trl, "vllm-serve", "--model", str(model_dir), "--port", str(port), "--gpu_memory_utilization", "0.3"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for method in [m for m in METHODS if (REPO / "examples" / f"train_{m}.py").exists()]:
            completed = subprocess.run(
                [sys.executable, f"examples/train_{method}.py", "--model_name_or_path", str(model_dir),
                 "--env_name", "multi_countdown", "--env_size", "16", "--output_dir", str(tmp_path / method),
                 "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "64",
                 "--max_steps", "2", "--report_to", "none", "--save_strategy", "no", "--use_vllm", "true",
                 "--vllm_mode", "server", "--vllm_server_port", str(port), "--vllm_server_timeout", "300",
                 "--bf16", "true", "--logging_steps", "1"]
                + (["--arg_max_accepted", "2", "--arg_max_empty_prefix", "2"] if method == "arg" else []),
                cwd=REPO, env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"}, capture_output=True, text=True,
                timeout=600)
            assert completed.returncode == 0, completed.stderr[-4000:]
            assert '"steps": 2' in completed.stdout
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_every_registered_method_is_trained_by_these_tests():
    """A method registered in `ppm_trl.methods` (not composed, not TRL's own) needs settings in
    dist_train_script.METHOD_SETTINGS: the registry, not a hand-kept list, decides what is tested here."""
    from ppm_trl.registry import METHODS as REGISTERED

    single = {name for name, method in REGISTERED.items() if not method.parts and method.trainer.startswith("ppm_trl")}
    assert single == set(METHODS)
