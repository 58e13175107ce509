#!/bin/bash
# llama.cpp's own n-gram speculation (llama-server --spec-type ngram-simple) beside MLXR's on the
# lent GPU, in one device call: builds llama-server from the carried tree unless this machine
# already has it (/root/sbs, as ../shared/peers/gpu_side_by_side.sh builds it; ~5 min on 16
# cores), then bench/peers/llama_spec.py with both engines interleaved (~2 min). From the repo root,
# carrying .peer/llama.cpp.tgz and .whl as gpu_side_by_side.sh does:
#   MLXR_COMMIT=<sha> bash bench/gpu/llama_spec.sh [--rounds 5 ...]
# or in two calls while the machine stays warm: `bash bench/gpu/llama_spec.sh build`, then the above.
# The JSON goes to $OUT when set (the device call's returned folder), else bench/results/<day>/.
set -u
W=/root/sbs; R=$PWD; B=$W/llama.cpp/build/bin
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH="/tmp/site:$R" PYTHONUNBUFFERED=1
[ -n "${OUT:-}" ] && export MLXR_BENCH_RESULTS=$OUT
bash bench/gpu/build_llama_server.sh || exit 1
[ "${1:-}" = build ] && { echo "llama-server: $B/llama-server"; exit 0; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 bench/peers/llama_spec.py --server-bin $B/llama-server --gpu --mlxr cuda "$@"
