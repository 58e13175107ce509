#!/bin/sh
# GPU tests plus the whole GPU sweep; run on the lent GPU machine from the repo root.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/test_gpu_engine.py tests/test_triton_attention.py tests/test_triton_fused.py 2>&1 | tail -15
cd bench && timeout 330 python3 gpu_sweep.py 2>&1 | grep -v "Loading weights"
