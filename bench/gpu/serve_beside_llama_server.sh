#!/bin/bash
# bench/serve.py's load (256 streamed /v1/completions of 128 + 128 tokens at 16/s, 64/s and all at
# once) against `mlxr serve` and then llama-server on the same TinyLlama-shape weights (bf16 HF
# dir / F16 GGUF), in one device call, with MLXR's runtime-compile counter read after the load.
# Uses the llama-server of bench/gpu/build_llama_server.sh (/root/sbs; built there if missing)
# and the fixture that ../shared/peers/gpu_side_by_side.sh writes (made here if missing).
# From the repo root, carrying .peer (serve_cmp.py, llama.cpp.tgz) and .whl:
#   bash bench/gpu/serve_beside_llama_server.sh
# SERVE_EXTRA adds `mlxr serve` flags, e.g. SERVE_EXTRA="--stream-interval 8" bash bench/gpu/serve_beside_llama_server.sh
set -u
W=/root/sbs; R=$PWD; B=$W/llama.cpp/build/bin
bash bench/gpu/build_llama_server.sh || exit 1
export PYTHONPATH="/tmp/site:$R" PYTHONUNBUFFERED=1
[ -f $W/fix/model-f16.gguf ] || python3 -m mlxr.testing write --config tinyllama-shape --out $W/fix --gguf-type f16 | tail -1
python3 -m mlxr.cli serve --model $W/fix/hf --device cuda --dtype bfloat16 --max-num-seqs 256 \
   --max-num-batched-tokens 8192 --kv-cache-gb 16 --port 8082 ${SERVE_EXTRA:-} > $W/mlxr.log 2>&1 & MP=$!
for i in $(seq 240); do curl -sf localhost:8082/health >/dev/null && break; sleep 1; done
(cd $R/bench && timeout 240 python3 $R/.peer/serve_cmp.py http://127.0.0.1:8082 auto MLXR 2>&1 | grep -v "^rate")
curl -s localhost:8082/metrics | grep -E "^mlxr:runtime_compiles_total" || echo "mlxr:runtime_compiles_total not reported"
kill $MP; wait $MP 2>/dev/null
$B/llama-server -m $W/fix/model-f16.gguf -ngl 99 -fa on -np 256 -c 131072 -b 4096 -ub 512 --port 8081 > $W/ls.log 2>&1 & LP=$!
for i in $(seq 120); do curl -sf localhost:8081/health >/dev/null && break; sleep 1; done
(cd $R/bench && timeout 240 python3 $R/.peer/serve_cmp.py http://127.0.0.1:8081 model-f16.gguf LLAMA-SERVER 2>&1 | grep -v "^rate")
kill $LP; wait $LP 2>/dev/null
