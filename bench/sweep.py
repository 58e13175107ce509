"""The standard benchmark set in one command, one JSON (bench/results/<day>/sweep-<device>-*.json).

  python bench/sweep.py --device cpu [--quick] [--llama-site /tmp/lcpp/lib/python3.11/site-packages]
  python bench/sweep.py --device cuda [--quick]
  make bench                               # --device cuda where nvidia-smi sees a GPU, else cpu

cpu: single-stream latency and batched throughput of the bundled Gemma 3 270M, then the GGUF
files (Gemma Q4_K_M, SmolLM2 Q4_1, TinyLlama shape Q4_K_M and Q8_0): with --llama-site,
cpu_vs_llama_cpp.py (MLXR and llama.cpp run by run interleaved), else quant_cpu.py alone.
cuda: gpu_sweep.py (latency, batches, kernels, a profile) and gpu_quant.py.
Each part is its own process (as it would be run by hand) writing its JSON into a scratch
folder; this script gathers them into one file. One-off investigations live in bench/probes/.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import print_table, write_result

BENCH = Path(__file__).resolve().parent


def cpu_parts(quick: bool, llama_site: str | None) -> list[tuple[str, list[str]]]:
    runs = ["--runs", "1" if quick else "3"]
    parts = [("latency", ["latency.py", "--model", "gemma3-270m", "--no-hf", *runs]),
             ("throughput", ["throughput.py", "--model", "gemma3-270m", "--batch", "1", "8", "--gen-len", "64",
                             "--no-hf"])]
    models = ["gemma3-270m"] if quick else ["gemma3-270m", "smollm2:135m", "tinyllama-shape-q4_k_m",
                                            "tinyllama-shape-q8_0"]
    if llama_site:  # run by run interleaved with llama.cpp (cpu_vs_llama_cpp.py)
        parts.append(("cpu_vs_llama_cpp", ["peers/cpu_vs_llama_cpp.py", "--site", llama_site, "--rounds",
                                           "1" if quick else "3", "--models", *models]))
    else:
        parts.append(("quant_cpu", ["quant_cpu.py", "--models", *models, *runs]))
    return parts


def cuda_parts(quick: bool) -> list[tuple[str, list[str]]]:
    return [("gpu_sweep", ["gpu/gpu_sweep.py", *(["--quick"] if quick else [])]), ("gpu_quant", ["gpu/gpu_quant.py"])]


def run_part(name: str, argv: list[str], scratch: Path, timeout: float) -> dict:
    out = scratch / name
    out.mkdir()
    env = {**os.environ, "MLXR_BENCH_RESULTS": str(out)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=BENCH, env=env, capture_output=True, text=True,
                          timeout=timeout)
    results = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    print(proc.stdout[-3000:], end="")
    return {"argv": argv, "returncode": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
            "stderr_tail": proc.stderr[-2000:] if proc.returncode else "", "results": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], required=True)
    p.add_argument("--quick", action="store_true", help="fewer models and runs (a smoke test of the sweep)")
    p.add_argument("--llama-site", default=None, help="site-packages with llama_cpp: run llama.cpp interleaved")
    p.add_argument("--part-timeout", type=float, default=3600.0)
    a = p.parse_args()
    parts = cpu_parts(a.quick, a.llama_site) if a.device == "cpu" else cuda_parts(a.quick)
    done = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in parts:
            print(f"== {name}: python bench/{' '.join(argv)}", flush=True)
            done[name] = run_part(name, argv, Path(tmp), a.part_timeout)
    path = write_result(f"sweep-{a.device}", {"device": a.device, "quick": a.quick, "parts": done})
    print_table([{"part": n, "rc": d["returncode"], "s": d["seconds"], "files": len(d["results"])}
                 for n, d in done.items()], ["part", "rc", "s", "files"])
    print(path)
    if any(d["returncode"] for d in done.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
