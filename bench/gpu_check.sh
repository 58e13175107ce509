#!/bin/sh
# GPU tests plus the engine sweep; run on the lent GPU machine from the repo root.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_engine.py -x 2>&1 | tail -15
sh bench/gpu_issue3.sh 2>&1 | grep -v "Loading weights"
