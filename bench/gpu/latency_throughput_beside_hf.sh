#!/bin/sh
# One GPU sweep for the engine issue: TinyLlama shape, bf16, torch reference ops, beside HF.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'
cd bench
python3 latency.py --model tinyllama-shape --device cuda --dtype bfloat16 --prompt-len 128 --gen-len 128 --runs 2
python3 throughput.py --model tinyllama-shape --device cuda --dtype bfloat16 --batch 1 8 64 256 --prompt-len 128 --gen-len 128 --kv-cache-gb 16 --max-num-batched-tokens 8192
