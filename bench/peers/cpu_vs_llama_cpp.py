"""MLXR against llama.cpp on this CPU, run by run interleaved (A B A B ...) on the same GGUF
files: quant_cpu.py and llama_cpp_cpu.py, each run a fresh process, 128-token prompt, 64
greedy tokens, both on --threads threads; MLXR also decodes 8 requests at once. Medians and
ratios per file, the CPU's model name and flags, the load average before and after (on a
shared machine other work is not under our control: interleaving spreads it over both).

  python bench/peers/cpu_vs_llama_cpp.py --site /tmp/lcpp/lib/python3.11/site-packages [--rounds 3]
      [--models gemma3-270m smollm2:135m tinyllama-shape-q4_k_m tinyllama-shape-q8_0]

JSON to bench/results/<day>/cpu_vs_llama_cpp-*.json; a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import median, print_table, write_result

BENCH = Path(__file__).resolve().parents[1]
MODELS = ["gemma3-270m", "smollm2:135m", "tinyllama-shape-q4_k_m", "tinyllama-shape-q8_0"]


def cpu_facts() -> dict:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in text.splitlines() if ":" in line}
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "gfni", "amx_tile", "amx_int8", "avx512_bf16")
    flags = field.get("flags", "").split()
    return {"model_name": field.get("model name", os.uname().machine), "cpus": len(os.sched_getaffinity(0)),
            "simd_flags": [f for f in wanted if f in flags]}


def one_run(engine: str, model: str, threads: int, site: str) -> dict:
    """One fresh process of quant_cpu.py or llama_cpp_cpu.py on one file: its JSON row."""
    if engine == "mlxr":
        argv = ["quant_cpu.py", "--models", model, "--runs", "1", "--batch", "8", "--repeats", "6", "--types", "Q4_K",
                "--threads", str(threads)]
    else:
        argv = ["peers/llama_cpp_cpu.py", "--models", model, "--runs", "1", "--threads", str(threads), "--site", site]
    with tempfile.TemporaryDirectory() as tmp:
        # OMP_WAIT_POLICY as `mlxr serve` sets it (config.openmp_environment)
        env = {**os.environ, "MLXR_BENCH_RESULTS": tmp, "OMP_WAIT_POLICY": "PASSIVE"}
        subprocess.run([sys.executable, *argv], cwd=BENCH, env=env, check=True, capture_output=True, timeout=1800)
        (result,) = Path(tmp).glob("*.json")
        return json.loads(result.read_text())["models"][0]


def summarize(model: str, runs: dict[str, list[dict]]) -> dict:
    ours, peer = runs["mlxr"], runs["llama.cpp"]
    row = {"model": model, "runs": len(ours)}
    for key in ("prefill_tok_s", "decode_tok_s"):
        row[f"mlxr_{key}"], row[f"llama_{key}"] = median([r[key] for r in ours]), median([r[key] for r in peer])
        row[f"{key.split('_')[0]}_ratio"] = row[f"mlxr_{key}"] / row[f"llama_{key}"]
    row["mlxr_batch8_decode_tok_s"] = median([r["batch8_decode_tok_s"] for r in ours])
    row["batch8_vs_llama_single"] = row["mlxr_batch8_decode_tok_s"] / row["llama_decode_tok_s"]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", required=True, help="site-packages holding llama_cpp (its own venv)")
    p.add_argument("--models", nargs="*", default=MODELS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    load_before = os.getloadavg()
    runs = {m: {"mlxr": [], "llama.cpp": []} for m in a.models}
    for r in range(a.rounds):
        for model in a.models:
            order = ("mlxr", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "mlxr")
            for engine in order:
                runs[model][engine].append(one_run(engine, model, a.threads, a.site))
                print(f"round {r} {model} {engine}: {runs[model][engine][-1]}", flush=True)
    rows = [summarize(m, runs[m]) for m in a.models]
    path = write_result("cpu_vs_llama_cpp", {"cpu": cpu_facts(), "threads": a.threads, "prompt_len": 128,
                                             "gen_len": 64, "load_avg_before": load_before,
                                             "kernel_env": {k: os.environ.get(k) for k in ("MLXR_AMX", "MLXR_VNNI_PANELS", "MLXR_CPU_KERNELS")},
                                             "load_avg_after": os.getloadavg(), "rows": rows, "runs": runs})
    print_table(rows, ["model", "mlxr_prefill_tok_s", "llama_prefill_tok_s", "prefill_ratio", "mlxr_decode_tok_s",
                       "llama_decode_tok_s", "decode_ratio", "mlxr_batch8_decode_tok_s", "batch8_vs_llama_single"])
    print(path)


if __name__ == "__main__":
    main()
