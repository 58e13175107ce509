#!/bin/sh
# On the lent GPU machine, from the repo root: `sh bench/gpu/tests_or_sweep.sh tests` runs every `gpu`
# test (about 6 minutes on an H200 with 8 workers), `sh bench/gpu/tests_or_sweep.sh sweep` the whole GPU
# sweep; each fits one 10-minute device call. Set MLXR_COMMIT to the commit under test: the
# machine's copy of the tree may carry a stale .git, which would stamp the results wrongly.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
case "$1" in
  tests)
    timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rf tests/engine/test_gpu_engine.py \
      tests/kernels/test_triton_attention.py tests/kernels/test_triton_fused.py tests/kernels/test_triton_gemv.py tests/kernels/test_qkv_rope.py \
      tests/kernels/test_quant_kernels.py tests/kernels/test_fp8.py tests/engine/test_sampler.py 2>&1 | tail -15 ;;
  sweep)
    cd bench/gpu && timeout 540 python3 gpu_sweep.py 2>&1 | grep -v "Loading weights" ;;
  *) echo "usage: sh bench/gpu/tests_or_sweep.sh tests|sweep" >&2; exit 2 ;;
esac
