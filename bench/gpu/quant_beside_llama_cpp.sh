#!/bin/bash
# Quantized GGUF on the GPU beside llama.cpp CUDA, one lease, two device calls (issue 42). From the
# repo root; the llama.cpp tree carried in the ignored .peer/ as ../shared/peers/gpu_side_by_side.sh
# says, the wheels in .whl/.
#   call 1, carry [".peer", ".whl"]:  bash bench/gpu/quant_beside_llama_cpp.sh prep
#       in the background: llama.cpp built, the 8B and TinyLlama F16 GGUFs written
#       (bench/gpu/write_shape_gguf.py), llama-quantize to Q4_K_M and Q8_0, llama-bench and
#       llama-batched-bench on them (/root/sbs/peer-*.txt); meanwhile the gpu tests of the
#       quantized kernels and bench/kernels/quant_gemm_table.py (the dispatcher's table, kept in
#       /root/sbs and copied to $OUT; TABLE_ARGS="--types Q4_K --models llama3-8b --merge" measures
#       part of it), then the gpu tests in MORE_TESTS (files) while the build goes on.
#   call 2, while the machine is warm, carry the same:  MLXR_COMMIT=<sha> bash bench/gpu/quant_beside_llama_cpp.sh mlxr
#       bench/gpu/gguf_decode.py on each file (SHAPES="llama3-8b-shape": one shape; with FIRST=1: a first start on an empty kernel cache
#       before each Q4_K_M run).
set -u
R=$PWD; W=/root/sbs; B=$W/llama.cpp/build/bin; mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH="/tmp/site:$R" PYTHONUNBUFFERED=1
peer() {  # llama.cpp figures of one file: decode (tg256), prefill (pp512), batch 1 and 64 decode
  $B/llama-bench -m $1 -ngl 99 -fa 1 -p 512 -n 256 -r 3 -o md 2>/dev/null | grep -E 'pp|tg'
  $B/llama-batched-bench -m $1 -ngl 99 -fa 1 -c 20000 -b 8192 -ub 512 -npp 128 -ntg 128 -npl 1,64 2>/dev/null | grep -E '^\|'
}
prep_background() {
  (cd $W && rm -rf llama.cpp && tar xzf $R/.peer/llama.cpp.tgz && cd llama.cpp && \
   cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > $W/cmake.log 2>&1 && \
   nice -n 10 cmake --build build -j14 --target llama-bench llama-batched-bench llama-quantize > $W/build.log 2>&1
   echo "llama.cpp build rc=$?") &
  for s in llama3-8b-shape tinyllama-shape; do
    mkdir -p $W/$s; python3 bench/gpu/write_shape_gguf.py $s $W/$s/model-f16.gguf
  done
  wait
  for s in llama3-8b-shape tinyllama-shape; do
    for t in Q4_K_M Q8_0; do $B/llama-quantize $W/$s/model-f16.gguf $W/$s/model-$t.gguf $t > /dev/null 2>&1; done
    rm -f $W/$s/model-f16.gguf
    for t in Q4_K_M Q8_0; do peer $W/$s/model-$t.gguf > $W/peer-$s-$t.txt; done
  done
  echo done > $W/prep.done
}
case "${1:-}" in
prep)
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  rm -f $W/prep.done; setsid bash -c "$(declare -f prep_background peer); R=$R W=$W B=$B; prep_background" > $W/prep.log 2>&1 < /dev/null &
  export MLXR_CACHE_DIR=/root/cache-tests
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rf tests/kernels/test_quant_gemm.py \
    tests/kernels/test_repacked_gemm.py 2>&1 | tail -6
  [ -n "${OUT:-}" ] && export MLXR_BENCH_RESULTS=$OUT
  cp mlxr/ops/quant/gemm_table.json $W/gemm_table.json  # TABLE_ARGS="... --merge" keeps its other cells
  (cd bench/kernels && timeout ${TABLE_S:-330} python3 quant_gemm_table.py ${TABLE_ARGS:-} --table $W/gemm_table.json \
     > ${OUT:-/tmp}/table.txt 2>&1; tail -75 ${OUT:-/tmp}/table.txt)
  cp $W/gemm_table.json ${OUT:-/tmp}/ 2>/dev/null
  if [ -n "${MORE_TESTS:-}" ] && [ ! -f $W/prep.done ]; then  # gpu tests of other kernels in the wait
    timeout $((540 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 -rfE $MORE_TESTS \
      > ${OUT:-/tmp}/more-tests.txt 2>&1; echo "more tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" ${OUT:-/tmp}/more-tests.txt | tail -20
  fi
  while [ ! -f $W/prep.done ] && [ $SECONDS -lt 565 ]; do sleep 2; done
  cat $W/prep.log; ls -la $W/*/ ;;
mlxr)
  while [ ! -f $W/prep.done ] && [ $SECONDS -lt 240 ]; do sleep 2; done; cat $W/prep.log
  cp $W/gemm_table.json mlxr/ops/quant/gemm_table.json
  [ -n "${OUT:-}" ] && export MLXR_BENCH_RESULTS=$OUT
  figs() {  # llama.cpp's figures of a file in gguf_decode.py's names
    python3 - $1 <<'PY'
import re, sys
out = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) >= 8 and c[-2] in ("pp512", "tg256"):
        out["prefill_512" if c[-2] == "pp512" else "decode_1"] = re.split(r"\s", c[-1])[0]
    if len(c) == 10 and c[0] == "128" and c[1] == "128" and c[2] == "64":
        out["batch_64"] = c[7]
print(" ".join(f"{k}={v}" for k, v in out.items()))
PY
  }
  cd bench/gpu
  for s in ${SHAPES:-llama3-8b-shape tinyllama-shape}; do
    f=$W/$s/model-Q4_K_M.gguf; p=$(figs $W/peer-$s-Q4_K_M.txt); echo "llama.cpp $s Q4_K_M: $p"
    export MLXR_CACHE_DIR=/root/cache-tests  # the kernels call 1's tests and table compiled
    if [ -n "${FIRST:-}" ]; then
      rm -rf /root/cache-$s; export MLXR_CACHE_DIR=/root/cache-$s  # a first start on the empty cache, then the restart
      timeout 200 python3 gguf_decode.py $f --label $s-Q4_K_M-first --first-start --llama-cpp $p 2>&1 | grep -v Loading | tail -4
    fi
    timeout 250 python3 gguf_decode.py $f --label $s-Q4_K_M --llama-cpp $p 2>&1 | grep -v Loading | tail -6
    f=$W/$s/model-Q8_0.gguf; p=$(figs $W/peer-$s-Q8_0.txt); echo "llama.cpp $s Q8_0: $p"
    timeout 200 python3 gguf_decode.py $f --label $s-Q8_0 --llama-cpp $p 2>&1 | grep -v Loading | tail -6
  done ;;
*) echo "usage: bash bench/gpu/quant_beside_llama_cpp.sh prep|mlxr" >&2; exit 2 ;;
esac
