# Two entry points for a fresh machine: `make run` (the server with the bundled model) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build of torch; on a CUDA machine use TORCH_SPEC="torch" (or a preinstalled torch).
TORCH_SPEC ?= torch==2.13.0

.PHONY: run chat generate test install webui

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/mlxr serve

chat: $(VENV)/.installed
	$(VENV)/bin/mlxr run gemma3-270m

generate: $(VENV)/.installed
	$(VENV)/bin/mlxr generate --model gemma3-270m "The capital of France is"

test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not gpu and not slow" --durations=15

# Rebuild the browser UI into mlxr/server/webui/static (committed; `make run` needs no Node).
webui:
	cd webui && npm ci && npm run build
