#!/bin/bash
# The gpu-marked tests of the whole tree (8 workers) and the mixed-LoRA batch bench, in one device
# call from the repo root, carrying .whl (the wheels the machine lacks):
#   MLXR_COMMIT=<sha> bash bench/gpu/features.sh [tests|lora|all]
# Full logs to $OUT (gpu-tests.txt, lora.txt); JSON results to $OUT too.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 MLXR_CACHE_DIR=/root/cache-features
[ -n "${OUT:-}" ] && export MLXR_BENCH_RESULTS=$OUT
O=${OUT:-/tmp}
run_tests() {
  timeout ${TESTS_S:-330} python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 -rfE --timeout 240 tests > $O/gpu-tests.txt 2>&1
  echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -30
}
run_lora() {
  timeout ${LORA_S:-240} python3 bench/lora_batch.py --device cuda > $O/lora.txt 2>&1
  echo "lora rc=$?"; grep -v "Loading weights" $O/lora.txt | tail -12
}
case "${1:-all}" in
  tests) run_tests ;;
  lora) run_lora ;;
  all) run_lora; run_tests ;;
  *) echo "usage: bash bench/gpu/features.sh [tests|lora|all]" >&2; exit 2 ;;
esac
