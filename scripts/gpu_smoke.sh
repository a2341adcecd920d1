#!/usr/bin/env bash
# GPU smoke test: on a CUDA machine with nothing installed, install the pinned GPU stack, then run
#   1. PPM, PAPO (with LoRA) and ARG for a few steps with vLLM colocate (sleep mode) on a small Qwen3-architecture
#      model built offline (no Hub access at run time),
#   2. one DeepSpeed ZeRO-3 run (ARG + vLLM colocate: sharded weights gathered for the weight sync, surprisal
#      forward on the sharded model),
#   3. the GPU tests (`pytest -m gpu`),
# and print step times and peak GPU memory per run (also written to $SMOKE_OUT/summary.md). Budget: < 9 minutes
# on one H100/H200, install included.
#
#   bash scripts/gpu_smoke.sh                                  # venv in .venv-gpu, installs the pinned stack
#   SKIP_INSTALL=1 PYTHON=/path/to/python bash scripts/gpu_smoke.sh   # reuse an environment that has it
# Knobs (environment): VENV, PYTHON, SKIP_INSTALL, SMOKE_OUT (outputs/gpu_smoke), STEPS (3), SKIP_PYTEST,
# SMOKE_ARCH (small | qwen3-1.7b: the Qwen3-1.7B shape, random weights, bf16).
# Without vLLM in the environment (SKIP_INSTALL=1) the runs fall back to HF generation and say so. With vLLM, the
# tests marked `vllm` (the CPU suite of `make test-vllm`) run too.
#
# The lent GPU machine as it is (no network; Python 3.12 + torch 2.11 + transformers 5.17 + accelerate 1.15 + peft
# preinstalled; at most 64 MiB of carried files): vLLM cannot be carried (~400 MB), so HF generation + ZeRO-3 +
# LoRA on the Qwen3-1.7B shape, timed, with peak memory:
#   bash scripts/gpu_smoke.sh --prepare-offline DIR   # here (PyPI): the wheels of scripts/gpu_offline_wheels.txt
#   bash scripts/gpu_smoke.sh --dry-run DIR           # here or there, no GPU: DIR matches the list, sizes vs 64 MiB
#   OFFLINE_WHEELS=DIR bash scripts/gpu_smoke.sh      # there: install from DIR only, then the runs
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL_LIST=scripts/gpu_offline_wheels.txt
CARRY_LIMIT_MIB=64

if [ "${1:-}" = --prepare-offline ]; then
  dir=${2:?usage: gpu_smoke.sh --prepare-offline DIR}
  mkdir -p "$dir"
  grep -v '^#' "$WHEEL_LIST" | awk 'NF == 2 { print $2 }' | grep -v '^deepspeed==' | while read -r spec; do
    "${PYTHON:-python3}" -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$dir" "$spec"
  done
  # DeepSpeed ships an sdist only: build a py3-none-any wheel here (its ops are JIT-compiled on the GPU machine).
  "${PYTHON:-python3}" -m pip wheel -q --no-deps --no-build-isolation -w "$dir" "$(grep -o 'deepspeed==[^ ]*' "$WHEEL_LIST")"
  set -- --dry-run "$dir"
fi
if [ "${1:-}" = --dry-run ]; then
  dir=${2:?usage: gpu_smoke.sh --dry-run DIR}
  exec "${PYTHON:-python3}" - "$WHEEL_LIST" "$dir" "$CARRY_LIMIT_MIB" <<'EOF'
import re
import sys
from pathlib import Path

list_path, wheel_dir, limit_mib = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
norm = lambda name: re.sub(r"[-_.]+", "_", name).lower()  # noqa: E731
wheels = {}
for wheel in wheel_dir.glob("*.whl"):
    name, version = wheel.name.split("-")[:2]
    wheels[(norm(name), version)] = wheel
locks = Path("constraints/tested.txt").read_text()  # the exact versions CI runs (pyproject.toml holds ranges)
sizes, problems = {"always": 0, "if-missing": 0}, []
print(f"{'tier':<11} {'wheel':<80} {'MiB':>6}")
for line in Path(list_path).read_text().splitlines():
    if not line.strip() or line.startswith("#"):
        continue
    tier, spec = line.split()
    name, version = spec.split("==")
    wheel = wheels.get((norm(name), version))
    if wheel is None:
        problems.append(f"{spec}: no wheel in {wheel_dir}")
        continue
    tags = wheel.name[:-4].split("-")[-3:]  # python, abi, platform
    if not (tags[0] in ("py3", "py312", "cp312", "cp310", "py2.py3") and tags[1] in ("none", "abi3", "cp312")
            and ("x86_64" in tags[2] or tags[2] == "any")):
        problems.append(f"{wheel.name}: not installable on CPython 3.12 x86_64")
    pinned = re.search(rf"^{re.escape(name)}==(\S+)", locks, re.IGNORECASE | re.MULTILINE)
    if pinned and pinned.group(1) != version:
        problems.append(f"{spec}: constraints/tested.txt locks {name}=={pinned.group(1)}")
    sizes[tier] += wheel.stat().st_size
    print(f"{tier:<11} {wheel.name:<80} {wheel.stat().st_size / 2**20:6.2f}")
mib = {tier: size / 2**20 for tier, size in sizes.items()}
print(f"always: {mib['always']:.1f} MiB; if-missing: {mib['if-missing']:.1f} MiB; all: {sum(mib.values()):.1f} MiB "
      f"(limit {limit_mib:.0f} MiB)")
if mib["always"] > limit_mib:
    problems.append(f"the always-carried wheels take {mib['always']:.1f} MiB > {limit_mib:.0f} MiB")
elif sum(mib.values()) > limit_mib:
    print(f"note: {limit_mib - mib['always']:.1f} MiB are left for if-missing wheels: carry only those the machine "
          "lacks (pyarrow, which datasets and trl import, is the largest)")
for problem in problems:
    print("gpu_smoke --dry-run: " + problem, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
fi

VENV=${VENV:-.venv-gpu}
STEPS=${STEPS:-3}
SMOKE_OUT=${SMOKE_OUT:-outputs/gpu_smoke}
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
SECONDS=0
mkdir -p "$SMOKE_OUT"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || {
  echo "gpu_smoke: no CUDA GPU visible (nvidia-smi failed)" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------- 0. install
if [ -n "${OFFLINE_WHEELS:-}" ]; then
  # The preinstalled interpreter; DIR as the only package source; the package itself without its lazy extras.
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install -q --no-index --find-links "$OFFLINE_WHEELS" \
    $(grep -v '^#' "$WHEEL_LIST" | awk '$1 == "always" { print $2 }')
  "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e .
  SKIP_INSTALL=1 SMOKE_ARCH=${SMOKE_ARCH:-qwen3-1.7b}
  echo "gpu_smoke: offline install from $OFFLINE_WHEELS done after ${SECONDS}s"
fi
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # torch first and exact: vllm pins it, and an unpinned resolve may pick another CUDA build.
  "$VENV/bin/pip" install -q "torch==2.13.0"
  "$VENV/bin/pip" install -q -c constraints/tested.txt -e '.[dev,vllm,deepspeed]'
  echo "gpu_smoke: install done after ${SECONDS}s"
fi
PY=${PYTHON:-$VENV/bin/python}
BIN=$(dirname "$PY")
"$PY" - <<'EOF'
import importlib

import torch

versions = []
for name in ("torch", "transformers", "trl", "accelerate", "peft", "vllm", "deepspeed"):
    try:
        versions.append(f"{name} {importlib.import_module(name).__version__}")
    except ImportError:
        versions.append(f"{name} MISSING")
print("gpu_smoke:", " | ".join(versions), "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA")
EOF
# With SKIP_INSTALL=1 in an environment without vLLM (or DeepSpeed), the runs fall back to HF generation (their
# names end in _hfgen) and the ZeRO-3 run is skipped, so the rest still runs; a full install has both.
HAS_VLLM=0; "$PY" -c "import vllm" 2>/dev/null && HAS_VLLM=1
HAS_DEEPSPEED=0; "$PY" -c "import deepspeed" 2>/dev/null && HAS_DEEPSPEED=1

# ------------------------------------------------------------------- a small Qwen3 model, built offline
SMOKE_ARCH=${SMOKE_ARCH:-small}
MODEL="$SMOKE_OUT/qwen3_$SMOKE_ARCH"
"$PY" - "$MODEL" "$SMOKE_ARCH" <<'EOF'
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ppm_trl.tiny import build_tiny_tokenizer

path = sys.argv[1]
tokenizer = build_tiny_tokenizer()  # byte-level, Qwen-style chat template
shapes = {
    "small": dict(vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    # Qwen3-1.7B's config with random weights, its 151,936-row embedding included (ids the byte tokenizer lacks
    # decode to ""): the real memory and compute of a step.
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128),
}
config = Qwen3Config(**shapes[sys.argv[2]], max_position_embeddings=2048, tie_word_embeddings=True,
                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
torch.manual_seed(0)
model = Qwen3ForCausalLM(config).to(torch.bfloat16)  # vLLM takes the dtype from the checkpoint
model.generation_config.eos_token_id = tokenizer.eos_token_id
model.generation_config.pad_token_id = tokenizer.pad_token_id
model.save_pretrained(path)
tokenizer.save_pretrained(path)
print(f"gpu_smoke: Qwen3 model, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {path}")
EOF

# ------------------------------------------------------------------------------------------ training runs
COMMON=(--model_name_or_path "$MODEL" --env_name multi_countdown --env_n 2 --env_size 64
        --max_steps "$STEPS" --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --num_generations 8
        --max_completion_length 256 --bf16 true --logging_steps 1 --save_strategy no --report_to none)
VLLM=(--use_vllm true --vllm_mode colocate --vllm_gpu_memory_utilization 0.2 --vllm_enable_sleep_mode true)
if [ "$HAS_VLLM" != 1 ]; then
  echo "gpu_smoke: vllm is NOT installed: the runs use HF generation (not the vLLM path)" >&2
  VLLM=()
fi

run() {  # name, accelerate config, example script, extra flags...
  local name=$1 config=$2 script=$3; shift 3
  local start=$SECONDS
  [ "$HAS_VLLM" = 1 ] || name="${name/_vllm/}_hfgen"
  local log="$SMOKE_OUT/$name.log" mem="$SMOKE_OUT/$name.mem"
  if [ "$config" = zero3.yaml ] && [ "$HAS_DEEPSPEED" != 1 ]; then
    echo "gpu_smoke: $name SKIPPED (deepspeed not installed)" >&2
    echo "$name skipped 0" >> "$SMOKE_OUT/runs.txt"
    return
  fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 > "$mem" &
  local monitor=$!
  local status=0
  "$BIN/accelerate" launch --config_file "configs/accelerate/$config" --num_processes 1 "examples/$script" \
    "${COMMON[@]}" ${VLLM[@]+"${VLLM[@]}"} --output_dir "$SMOKE_OUT/$name" "$@" > "$log" 2>&1 || status=$?
  kill "$monitor" 2>/dev/null || true
  wait "$monitor" 2>/dev/null || true
  echo "$name $status $((SECONDS - start))" >> "$SMOKE_OUT/runs.txt"
  if [ "$status" != 0 ]; then
    echo "gpu_smoke: $name FAILED (exit $status); last lines of $log:" >&2
    tail -n 30 "$log" >&2
  else
    echo "gpu_smoke: $name ok in $((SECONDS - start))s"
  fi
}

: > "$SMOKE_OUT/runs.txt"
run ppm_vllm single_gpu.yaml train_ppm.py
run papo_vllm_lora single_gpu.yaml train_papo.py --use_peft true --lora_r 16 --lora_alpha 32 \
  --lora_target_modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
run arg_vllm single_gpu.yaml train_arg.py
run arg_vllm_zero3 zero3.yaml train_arg.py

# --------------------------------------------------------------------------------------------- GPU tests
PYTEST_STATUS=0
if [ "${SKIP_PYTEST:-0}" != 1 ]; then
  start=$SECONDS
  "$PY" -m pytest -q -m gpu -p no:cacheprovider -rs tests 2>&1 | tee "$SMOKE_OUT/pytest_gpu.log" || PYTEST_STATUS=$?
  echo "pytest_gpu $PYTEST_STATUS $((SECONDS - start))" >> "$SMOKE_OUT/runs.txt"
fi

# ------------------------------------------------- the real vLLM engine (the suite `make test-vllm` runs on CPU)
if [ "${SKIP_PYTEST:-0}" != 1 ] && [ "$HAS_VLLM" = 1 ]; then
  start=$SECONDS
  status=0
  "$PY" -m pytest -q -m vllm -p no:cacheprovider -rs tests 2>&1 | tee "$SMOKE_OUT/pytest_vllm.log" || status=$?
  echo "pytest_vllm $status $((SECONDS - start))" >> "$SMOKE_OUT/runs.txt"
fi

# ------------------------------------------------------------------------------------------------ summary
"$PY" - "$SMOKE_OUT" <<'EOF'
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])
lines = ["| run | exit | wall s | steps | first step s | median later step s | peak torch GiB | peak GPU (nvidia-smi) GiB |",
         "|---|---|---|---|---|---|---|---|"]
for record in (out / "runs.txt").read_text().split("\n"):
    if not record.strip():
        continue
    name, status, wall = record.split()
    summary, peak_smi = {}, None
    log = out / f"{name}.log"
    if log.exists():
        done = [line for line in log.read_text().splitlines() if ": done {" in line]
        summary = json.loads(done[-1].split(": done ", 1)[1]) if done else {}
    mem = out / f"{name}.mem"
    if mem.exists():
        used = [int(v) for v in mem.read_text().split() if v.strip().isdigit()]
        peak_smi = max(used) / 1024 if used else None
    steps = summary.get("step_time_s") or []
    row = [name, status, wall, str(summary.get("steps", "-")),
           f"{steps[0]:.2f}" if steps else "-",
           f"{statistics.median(steps[1:]):.2f}" if len(steps) > 1 else "-",
           f"{summary['peak_torch_gpu_memory_gib']:.2f}" if "peak_torch_gpu_memory_gib" in summary else "-",
           f"{peak_smi:.2f}" if peak_smi is not None else "-"]
    lines.append("| " + " | ".join(row) + " |")
table = "\n".join(lines)
(out / "summary.md").write_text(table + "\n")
print(table)
EOF
echo "gpu_smoke: total ${SECONDS}s"
if awk '$2 != 0 && $2 != "skipped" { failed = 1 } END { exit !failed }' "$SMOKE_OUT/runs.txt"; then
  echo "gpu_smoke: FAILED (see the logs in $SMOKE_OUT)" >&2
  exit 1
fi
if [ "$HAS_VLLM" != 1 ] || grep -q " skipped " "$SMOKE_OUT/runs.txt"; then
  echo "gpu_smoke: passed, but without vLLM or with SKIPPED runs (see above): not a full GPU check"
else
  echo "gpu_smoke: all runs passed"
fi
