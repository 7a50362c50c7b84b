# Two commands do everything: `make run` (a real research run) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
# llama-cpp-python compiles llama.cpp from source the first time (minutes on 2 cores); pip
# caches the wheel afterwards.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)
QUESTION ?= Which modules does the run loop in src/keel/_run/loop.py depend on?

.PHONY: run demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[local]'
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,local,browser]'
	touch $@ $(STAMP_RUN)

# The first turn must look at the repository (--first-turn-tool); the run prints a summary and
# the exact `keel show` command that opens it. Both targets use the default store (no --store),
# so `keel runs` and `keel show` find their runs afterwards without one.
run: $(STAMP_RUN)
	$(BIN)/keel run "$(QUESTION)" --model local --repo . --max-model-calls 8 --first-turn-tool

demo: $(STAMP_RUN)
	$(BIN)/keel run "Which modules does the run loop depend on, and where does it stop a repeating tool call?" \
		--model script:examples/repeated_research.json --repo .

lint: $(STAMP_DEV)
	$(BIN)/ruff check --no-cache src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: $(STAMP_DEV)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/checkpoint.py
	$(BIN)/python benchmarks/durability.py
	$(BIN)/python benchmarks/prompt_cache.py
	$(BIN)/python benchmarks/local_model.py
	$(BIN)/python benchmarks/confine.py
	$(BIN)/python benchmarks/observability.py
	$(BIN)/python benchmarks/pool.py
	$(BIN)/python benchmarks/replay.py

clean:
	rm -rf $(VENV) .venv-litellm .pytest_cache .mypy_cache .ruff_cache
