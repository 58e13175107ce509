"""The whole GPU sweep in one command (TinyLlama shape, bf16): single-stream decode (prompt 128,
gen 256), prefill of 512, batch 1/8/64/256 decode (prompt 128, gen 128), MLXR beside HF
transformers on the same weights in the same run, then the kernel microbenchmarks and a
per-op profile. JSON to bench/results/gpu_sweep-*.json; a table last.

  python bench/gpu/gpu_sweep.py [--quick | --skip-hf]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import device_name, median, peer_figures, print_table, write_result
from latency import bench_hf, bench_mlxr, model_paths, prompt_ids
from throughput import run_hf, run_mlxr, workload



def mlxr_figures(llm, vocab: int, batches: list[int], spread: dict, runs: int = 3) -> dict:
    """Medians of `runs` timed runs each; each batch's runs also go to `spread` (the JSON keeps
    them). A batch's decode lasts well under a second, so one run is at the mercy of a host
    hiccup (one batch-256 run measured 62k tok/s where the next ones gave 83-96k); each run
    draws new prompts, so none is served from the prefix cache."""
    single = bench_mlxr(llm, "cuda", prompt_ids(vocab, 128), 256, runs)
    prefill = bench_mlxr(llm, "cuda", prompt_ids(vocab, 512), 2, runs)
    out = {"decode_1": single["decode_tok_s"], "prefill_512": prefill["prefill_tok_s"]}
    for b in batches:
        spread[f"batch_{b}"] = [run_mlxr(llm, workload(vocab, b, 128, 128, False, seed=b * 10 + r), "cuda")
                                ["decode_tok_s"] for r in range(runs)]
        out[f"batch_{b}"] = median(spread[f"batch_{b}"])
    return out


def hf_figures(hf_kwargs: dict, vocab: int, batches: list[int]) -> dict:
    from transformers import AutoModelForCausalLM

    single = bench_hf(hf_kwargs, torch.bfloat16, "cuda", prompt_ids(vocab, 128), 256, 1)
    prefill = bench_hf(hf_kwargs, torch.bfloat16, "cuda", prompt_ids(vocab, 512), 2, 1)
    out = {"decode_1": single["decode_tok_s"], "prefill_512": prefill["prefill_tok_s"]}
    model = AutoModelForCausalLM.from_pretrained(**hf_kwargs, dtype=torch.bfloat16).to("cuda").eval()
    run_hf(model, workload(vocab, 2, 16, 4, False), "cuda")
    for b in batches:
        out[f"batch_{b}"] = run_hf(model, workload(vocab, b, 128, 128, False), "cuda")["decode_tok_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="batches 1 and 8 only, no HF")
    p.add_argument("--skip-hf", action="store_true", help="every batch size, no HF transformers run")
    p.add_argument("--runs", type=int, default=3, help="timed runs per figure (the median is quoted)")
    p.add_argument("--engine-process", choices=["on", "off"], default=None,
                   help="the engine core in its own process or in this one (default: the engine's choice)")
    p.add_argument("--llama-cpp", nargs="*", metavar="WORK=TOK_S",
                   help="llama.cpp's figures from the same lease (decode_1, prefill_512, batch_64, batch_256)")
    p.add_argument("--no-extras", action="store_true", help="skip the kernel benchmarks and the profile")
    a = p.parse_args()
    knobs = {} if a.engine_process is None else {"engine_process": a.engine_process == "on"}
    from mlxr import LLM

    batches = [1, 8] if a.quick else [1, 8, 64, 256]
    ref, hf_kwargs = model_paths("tinyllama-shape")
    llm = LLM(ref, dtype=torch.bfloat16, device="cuda", max_num_seqs=256,
              max_num_batched_tokens=8192, kv_cache_memory_gb=16, **knobs)
    vocab = llm.args.vocab_size
    spread: dict[str, list[float]] = {}
    ours = mlxr_figures(llm, vocab, batches, spread, a.runs)
    engine_process = llm.loaded is None
    compiles = llm.engine.stats().runtime_compiles
    llm.shutdown()
    del llm
    torch.cuda.empty_cache()
    theirs = {} if a.quick or a.skip_hf else hf_figures(hf_kwargs, vocab, batches)
    peer = {k: v[0] for k, v in peer_figures(a.llama_cpp).items()}
    rows = [{"work": k, "mlxr_tok_s": v, "hf_tok_s": theirs.get(k), "llama_cpp_tok_s": peer.get(k),
             "vs_llama_cpp": v / peer[k] if k in peer else None, "mlxr_runs_tok_s": spread.get(k)}
            for k, v in ours.items()]
    path = write_result("gpu_sweep", {"model": "tinyllama-shape", "dtype": "bfloat16",
                                      "device": device_name("cuda"), "runs_per_figure": a.runs,
                                      "engine_process": engine_process, "runtime_compiles": compiles,
                                      "results": rows})
    if not a.skip_hf and not a.no_extras:
        subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "kernels" / "kernels.py")], check=False)
    if not a.no_extras:
        subprocess.run([sys.executable, "-m", "mlxr.cli", "bench", "--model", ref, "--device", "cuda",
                        "--dtype", "bfloat16", "--gen-len", "32", "--profile"], check=False)
    print_table(rows, ["work", "mlxr_tok_s", "hf_tok_s", "llama_cpp_tok_s", "vs_llama_cpp"])
    print(path)


if __name__ == "__main__":
    main()
