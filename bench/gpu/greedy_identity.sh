#!/bin/bash
# The engine-core issue's "greedy outputs token-identical before and after, on the GPU": every
# fixture (HF dir and GGUF) through bench/greedy_identity.py on an older tree and on this one, on
# CUDA in bf16 and fp32; this tree with the engine core in its own process and in-process.
# The old tree's mlxr/ in the ignored .old/ (git archive <commit> mlxr bench pyproject.toml | tar -x -C .old);
#   device call, carry [".old", ".whl"]:  bash bench/gpu/greedy_identity.sh   (token ids as JSON under $OUT)
set -u -o pipefail
R=$PWD; D=${OUT:-/tmp/identity}; mkdir -p $D
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
for dt in bfloat16 float32; do
  PYTHONPATH=/tmp/site:$R/.old timeout 200 python3 bench/greedy_identity.py --device cuda --dtype $dt \
    --out $D/old-$dt.json 2>&1 | tail -1
  for proc in on off; do
    PYTHONPATH=/tmp/site:$R timeout 200 python3 bench/greedy_identity.py --device cuda --dtype $dt \
      --engine-process $proc --out $D/new-$dt-core-$proc.json --compare $D/old-$dt.json 2>&1 | tail -1
  done
done
