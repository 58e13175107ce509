"""Decode tok/s for several CPU thread settings, alone and beside a competing CPU-bound process.

    python bench/threads.py [--model gemma3-270m] [--reps 3] [--gen-len 32]

Each run is a fresh `mlxr bench` process; the settings and the with/without-competitor
conditions are interleaved (round-robin, shuffled per round) so that load from other work on a
shared machine spreads over all of them. The competitor is one process spinning in Python.
Writes bench/results/threads-<date>.json with every run, the medians, `lscpu`'s model name and
the load average before and after (other processes on the machine are not under our control).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from common import median, print_table, write_result

# "default": no --threads, MLXR_NUM_THREADS nor OMP_WAIT_POLICY: config.default_num_threads and
# config.openmp_environment. "2-spin": two threads whose idle OpenMP threads spin
# (OMP_WAIT_POLICY=ACTIVE); before the wait policy was set the default spun too (libgomp's
# default spins for a while before sleeping).
# "2-pool": the quantized matmuls on ops/quant/pool.h instead of OpenMP's team (MLXR_POOL=1),
# the A/B of the pool; "2-pool-nospin": the pool's helpers sleep at once after a job.
SETTINGS = {"1": (["--threads", "1"], {}), "2": (["--threads", "2"], {}), "default": ([], {}),
            "2-spin": (["--threads", "2"], {"OMP_WAIT_POLICY": "ACTIVE"}),
            "2-pool": (["--threads", "2"], {"MLXR_POOL": "1"}),
            "2-pool-nospin": (["--threads", "2"], {"MLXR_POOL": "1", "MLXR_POOL_SPIN_US": "0"}),
            # libgomp's GOMP_SPINCOUNT (~100 spins a microsecond) beside the PASSIVE policy: idle
            # threads spin that long before they sleep (libgomp's own default, policy unset, is 300k).
            "spin-20k": ([], {"GOMP_SPINCOUNT": "20000"}), "spin-100k": ([], {"GOMP_SPINCOUNT": "100000"}),
            "spin-300k": ([], {"GOMP_SPINCOUNT": "300000"})}


def lscpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def one_run(model: str, setting: str, gen_len: int) -> dict:
    extra, extra_env = SETTINGS[setting]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        env = {k: v for k, v in os.environ.items()
               if k not in ("MLXR_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MLXR_POOL",
                           "MLXR_POOL_SPIN_US")} | extra_env
        cmd = [sys.executable, "-m", "mlxr.cli", "bench", "--model", model, "--prompt-len", "32",
               "--gen-len", str(gen_len), "--json", str(out), *extra]
        subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=600)
        return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--gen-len", type=int, default=16)
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated subset of {list(SETTINGS)}")
    ns = p.parse_args()
    settings = ns.settings.split(",")
    load_before = os.getloadavg()
    cases = [(s, c) for s in settings for c in (False, True)]
    runs = []
    for rep in range(ns.reps):
        random.Random(rep).shuffle(cases)
        for setting, competing in cases:
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if competing else None
            try:
                figures = one_run(ns.model, setting, ns.gen_len)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            runs.append({"rep": rep, "setting": setting, "threads": figures["threads"], "competitor": competing,
                         "decode_tok_s": figures["decode_tok_s"], "loadavg_1m": os.getloadavg()[0]})
            print(runs[-1], flush=True)
    rows = []
    for setting in settings:
        for competing in (False, True):
            xs = [r["decode_tok_s"] for r in runs if r["setting"] == setting and r["competitor"] == competing]
            threads = next(r["threads"] for r in runs if r["setting"] == setting)
            rows.append({"setting": setting, "threads": threads, "competitor": competing,
                         "median_decode_tok_s": median(xs), "runs": len(xs)})
    print_table(rows, ["setting", "threads", "competitor", "median_decode_tok_s", "runs"])
    best = max(r["median_decode_tok_s"] for r in rows if r["competitor"])
    default = next(r["median_decode_tok_s"] for r in rows if r["competitor"] and r["setting"] == "default")
    path = write_result("threads", {
        "model": ns.model, "cpu": lscpu_model(), "usable_cpus": len(os.sched_getaffinity(0)),
        "gen_len": ns.gen_len, "reps": ns.reps, "settings": {k: SETTINGS[k] for k in settings}, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "note": "shared machine: other agents' processes ran during these runs (see loadavg); "
                "conditions interleaved so that this load spreads over all of them",
        "medians": rows, "default_vs_best_with_competitor": default / best, "runs": runs,
    })
    print(f"default / best with a competitor: {default / best:.2f}; wrote {path}")


if __name__ == "__main__":
    main()
