#!/bin/sh
# Quantized-inference GPU tests plus bench/gpu/gpu_quant.py; run on the lent GPU machine from the
# repo root. The GGUF files are written there (fixture + `mlxr quantize`), a few minutes once.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_quant_kernels.py tests/kernels/test_fp8.py \
  tests/engine/test_gpu_engine.py 2>&1 | tail -8
cd bench/gpu && timeout 420 python3 gpu_quant.py 2>&1 | grep -v "Loading weights"
