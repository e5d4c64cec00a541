# inferd: two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT_ARGS ?=
REPO ?= examples
# the OpenAI-compatible API beside KServe's (examples/tiny_llm answers it; docs/openai.md); OPENAI_ARGS= turns it off
OPENAI_ARGS ?= --openai-port 9000 --tool-call-parser llama3

.PHONY: run test lint protos bench venv clean test-all test-gpu azurite fuzz

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# constraints.txt pins dev/CI versions (torch: the local CPU build); the editable install generates the
# gRPC modules (setup.py), `make protos` refreshes them after a .proto edit
$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py constraints.txt
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

protos: $(VENV)/.installed
	$(BIN)/python protos/generate.py

run: venv protos
	$(BIN)/inferd --model-repository $(REPO) $(OPENAI_ARGS) $(PORT_ARGS)

lint: venv protos
	$(BIN)/ruff check .
	$(BIN)/mypy supervisor worker pytriton
	$(BIN)/lint-imports  # the import directions in pyproject.toml [tool.importlinter]

test: lint
	$(BIN)/python -m pytest -q

test-all: venv protos
	$(BIN)/python -m pytest -q -m ''

# Azurite (Azure Blob Storage emulator, npm) for the as:// repository tests, into tests/.node
azurite:
	npm install --prefix tests/.node --no-audit --no-fund azurite@3

test-gpu: venv protos
	$(BIN)/python -m pytest -q -m gpu tests/gpu

bench: venv protos
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# coverage-guided fuzzing (atheris), FUZZ_SECONDS per target; FUZZ_TARGETS picks some (fuzz/README.md)
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: venv protos
	$(BIN)/python fuzz/run.py --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS) $(FUZZ_TARGETS)

clean:
	rm -rf $(VENV) supervisor/_gen build dist *.egg-info
