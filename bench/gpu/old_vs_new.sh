#!/bin/bash
# Single-stream decode and prefill of 512 (bench/gpu/gpu_sweep.py's mlxr_figures, TinyLlama shape bf16)
# of this tree and an older one, interleaved in one lease of the GPU machine: is this tree slower?
# This tree runs twice: its default (the engine core in its own process on CUDA) and
# MLXR_ENGINE_PROCESS=0 (in this process, as the old tree ran before the split).
# The old tree's mlxr/ and bench/ go in the ignored .old/ (git archive <commit> mlxr bench | tar -x -C .old);
#   device call, carry [".old", ".whl"]:  MLXR_COMMIT=<sha> OLD_COMMIT=<sha> bash bench/gpu/old_vs_new.sh [rounds]
#   (JSON: gpu_old_vs_new-*.json under $OUT, or bench/results without $OUT)
#   ARMS="old new" BATCHES="1 256 64" ...: which arms run, which offline batches are timed (default: all three arms, 1)
#   or ... bash bench/gpu/old_vs_new.sh profile   (bench/probes/prefill_profile.py in each tree, in-process)
set -u
R=$PWD; FIX=/root/sbs/fix
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
[ -f $FIX/hf/config.json ] || PYTHONPATH=/tmp/site:$R python3 -m mlxr.testing write --config tinyllama-shape --out $FIX | tail -1
if [ "${1:-}" = profile ]; then
  for tree in .old .; do
    MLXR_ENGINE_PROCESS=0 PYTHONPATH=/tmp/site:$R/$tree timeout 200 python3 $R/bench/probes/prefill_profile.py \
      --model-dir $FIX/hf --label $tree 2>&1 | grep -v "Loading weights\|INFO"
  done
  exit 0
fi
ROUNDS=/tmp/old_vs_new_rounds.jsonl; : > $ROUNDS
for round in $(seq ${1:-3}); do
  for arm in ${ARMS:-old new new-inprocess}; do
    tree=.; [ $arm = old ] && tree=.old
    proc=; [ $arm = new-inprocess ] && proc=0
    (cd $R/$tree/bench && env ${proc:+MLXR_ENGINE_PROCESS=$proc} PYTHONPATH=/tmp/site:$R/$tree timeout 150 python3 - $FIX/hf $arm ${BATCHES:-1} <<'PY' 2>&1 | grep '^{'
import json, sys
import torch
sys.path.insert(0, "gpu")  # this tree's gpu_sweep.py (an older tree's lies in bench/ itself)
from gpu_sweep import mlxr_figures
from mlxr import LLM
llm = LLM(sys.argv[1], dtype=torch.bfloat16, device="cuda", max_num_seqs=256, max_num_batched_tokens=8192,
          kv_cache_memory_gb=16)
spread = {}
out = mlxr_figures(llm, llm.args.vocab_size if hasattr(llm, "args") else llm.loaded.args.vocab_size,
                   [int(b) for b in sys.argv[3:]], spread, 3)
print(json.dumps({"tree": sys.argv[2], **out}))
PY
    ) | tee -a $ROUNDS
  done
done
[ -s $ROUNDS ] && PYTHONPATH=/tmp/site:$R MLXR_BENCH_RESULTS=${OUT:-} python3 - $ROUNDS <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench")
import os, torch
from common import write_result
if not os.environ.get("MLXR_BENCH_RESULTS"):
    del os.environ["MLXR_BENCH_RESULTS"]
rows = [json.loads(line) for line in open(sys.argv[1])]
arms = sorted({r["tree"] for r in rows})
keys = [k for k in rows[0] if k != "tree"]
medians = {a: {k: statistics.median(r[k] for r in rows if r["tree"] == a) for k in keys} for a in arms}
print(write_result("gpu_old_vs_new", {"device": torch.cuda.get_device_name(), "old_commit": os.environ.get("OLD_COMMIT", "?"),
      "model": "TinyLlama shape bf16 (random weights)", "rounds": rows, "medians": medians}))
print(json.dumps(medians))
PY
