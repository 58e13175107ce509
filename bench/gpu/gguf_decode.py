"""One GGUF file on the GPU, one engine start: time from nothing to a ready engine (loading,
kernel compiles, CUDA graph capture, warm-up: what `mlxr serve` does before it reports healthy),
then single-stream decode (prompt 128, 256 generated), prefill of 512 and batch-64 decode
(prompt 128, 128 out), and the kernels compiled after the warm-up (runtime compiles). Run it in
a fresh process against an empty MLXR_CACHE_DIR for a first start, again for a restart
(bench/gpu/quant_beside_llama_cpp.sh does both beside llama.cpp). JSON to bench/results/.

  python bench/gpu/gguf_decode.py FILE --label 8b-Q4_K_M [--first-start] [--llama-cpp decode_1=286 ...]
"""
from __future__ import annotations

import argparse
import os
import time

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import device_name, median, peer_figures, print_table, write_result
from latency import bench_mlxr, prompt_ids
from throughput import run_mlxr, workload


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("gguf")
    p.add_argument("--label", required=True)
    p.add_argument("--first-start", action="store_true", help="single stream only (the cache was empty)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cpu: a check of the script on a small file")
    p.add_argument("--llama-cpp", nargs="*", metavar="WORK=TOK_S", help="llama.cpp's figures from the same lease")
    a = p.parse_args()
    from mlxr import LLM

    t0 = time.perf_counter()
    llm = LLM(a.gguf, device=a.device, dtype=torch.bfloat16, max_num_seqs=max(a.batch, 8),
              max_num_batched_tokens=8192, kv_cache_memory_gb=8)
    ready = time.perf_counter() - t0
    vocab = llm.args.vocab_size
    out = {"decode_1": bench_mlxr(llm, a.device, prompt_ids(vocab, 128), 256, a.runs)["decode_tok_s"]}
    runs = {}
    if not a.first_start:
        out["prefill_512"] = bench_mlxr(llm, a.device, prompt_ids(vocab, 512), 2, a.runs)["prefill_tok_s"]
        runs[f"batch_{a.batch}"] = [run_mlxr(llm, workload(vocab, a.batch, 128, 128, False, seed=r), a.device)
                                    ["decode_tok_s"] for r in range(a.runs)]
        out[f"batch_{a.batch}"] = median(runs[f"batch_{a.batch}"])
    compiles = llm.engine.stats().runtime_compiles
    peer = {k: v[0] for k, v in peer_figures(a.llama_cpp).items()}
    rows = [{"work": k, "mlxr_tok_s": v, "llama_cpp_tok_s": peer.get(k),
             "vs_llama_cpp": v / peer[k] if k in peer else None, "mlxr_runs_tok_s": runs.get(k)} for k, v in out.items()]
    path = write_result(f"gguf_decode-{a.label}", {
        "file": os.path.basename(a.gguf), "label": a.label, "device": device_name(a.device),
        "first_start": a.first_start, "time_to_ready_s": ready, "runtime_compiles": compiles,
        "kernel_cache": os.environ.get("TRITON_CACHE_DIR"), "runs_per_figure": a.runs, "results": rows})
    print(f"{a.label}: ready in {ready:.1f}s, runtime compiles {compiles}, first start {a.first_start}")
    print_table(rows, ["work", "mlxr_tok_s", "llama_cpp_tok_s", "vs_llama_cpp"])
    print(path)


if __name__ == "__main__":
    main()
