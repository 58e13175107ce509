#!/bin/bash
# The engine-core issue's GPU figures beside llama.cpp in one lease, in two device calls (from the
# repo root, the llama.cpp tree carried in the ignored .peer/ as ../shared/peers/gpu_side_by_side.sh
# says):
#   call 1, carry [".peer", ".whl"]:  bash bench/gpu/sweep_beside_llama_cpp.sh peer   (build, llama-bench, llama-batched-bench;
#                                     their figures parsed into /root/sbs/peer_args)
#   call 2 while the machine is warm, carry the same:  MLXR_COMMIT=<sha> bash bench/gpu/sweep_beside_llama_cpp.sh mlxr
#                                     (bench/gpu/gpu_sweep.py --skip-hf --no-extras --runs 5 with those figures)
set -u
R=$PWD; W=/root/sbs
case "${1:-}" in
peer)
  bash .peer/gpu_side_by_side.sh build | tee $W.txt
  python3 - $W.txt > $W/peer_args <<'PY'
import re, sys
text = open(sys.argv[1]).read()
out, f16 = {}, True
for line in text.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 8 and cells[-2] in ("pp512", "tg256") and f16:
        key = "prefill_512" if cells[-2] == "pp512" else "decode_1"
        out.setdefault(key, re.split(r"\s", cells[-1])[0])
    if len(cells) >= 8 and cells[-2] == "tg256":
        f16 = False  # llama-bench prints F16 first, then Q8_0 and Q4_K_M
    if len(cells) == 10 and cells[0] == "128" and cells[1] == "128":
        out[f"batch_{cells[2]}"] = cells[7]
print(" ".join(f"{k}={v}" for k, v in out.items() if k != "batch_1"))
PY
  echo "llama.cpp figures: $(cat $W/peer_args)" ;;
mlxr)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH="/tmp/site:$R" PYTHONUNBUFFERED=1
  [ -n "${OUT:-}" ] && export MLXR_BENCH_RESULTS=$OUT
  cd bench/gpu && timeout 560 python3 gpu_sweep.py --skip-hf --no-extras --runs 5 --llama-cpp $(cat $W/peer_args) 2>&1 \
    | grep -v "Loading weights" | tail -20 ;;
*) echo "usage: bash bench/gpu/sweep_beside_llama_cpp.sh peer|mlxr" >&2; exit 2 ;;
esac
