"""Quantized inference on the GPU: the TinyLlama shape as GGUF Q8_0 and Q4_K_M (weights kept
in their blocks, Triton dequantize-and-multiply kernels) and as FP8 E4M3 from the bf16
checkpoint, beside llama.cpp's CUDA figures for the same files (BENCHMARKS.md, H200).

  python bench/gpu/gpu_quant.py            # writes the GGUF files once, then the sweep

Single-stream decode: prompt 128, 256 generated; prefill: a 512-token prompt. Agreement: the
fp32-activation run of each GGUF against the same file dequantized to fp32, teacher-forced
top-1 over 512 tokens (16 by prefill, the rest by decode steps).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import device_name, peer_figures, print_table, write_result
from latency import bench_mlxr, prompt_ids

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
# llama.cpp CUDA on an H200, TinyLlama shape (BENCHMARKS.md): (decode, prefill 512) tok/s.


def gguf_file(file_type: str) -> Path:
    from mlxr.testing.fixtures import fixture_paths

    src = fixture_paths("tinyllama-shape", ROOT / ".fixtures").gguf_path
    out = ROOT / ".fixtures" / "tinyllama-quantized" / f"tinyllama-shape-{file_type}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "mlxr.cli", "quantize", str(src), "--type", file_type, str(out)],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def speed(ref: str, quantization: str | None, peer: list[float] | None, label: str) -> dict:
    """peer: llama.cpp's (decode, prefill) tok/s from the same lease, or None."""
    from mlxr import LLM

    llm = LLM(ref, engine_process=False, device="cuda", dtype=torch.bfloat16, quantization=quantization, max_num_seqs=8,
              max_num_batched_tokens=2048, kv_cache_memory_gb=4)
    vocab = llm.args.vocab_size
    decode = bench_mlxr(llm, "cuda", prompt_ids(vocab, 128), 256, 2)["decode_tok_s"]
    prefill = bench_mlxr(llm, "cuda", prompt_ids(vocab, 512), 2, 2)["prefill_tok_s"]
    row = {"weights": label, "quantization": llm.loaded.quantization, "decode_tok_s": decode,
           "prefill_512_tok_s": prefill}
    if peer:
        row.update(llama_cpp_decode=peer[0], decode_ratio=decode / peer[0],
                   llama_cpp_prefill=peer[1], prefill_ratio=prefill / peer[1])
    del llm
    torch.cuda.empty_cache()
    return row


def agreement(path: Path) -> float:
    from mlxr import LLM, SamplingParams
    from paged_probe import paged_logits

    quant = LLM(str(path), engine_process=False, device="cuda", dtype=torch.float32, max_num_seqs=1, kv_cache_memory_gb=2)
    ids = prompt_ids(quant.args.vocab_size, 16)
    ids += quant.generate([ids], SamplingParams(max_tokens=496, temperature=1.0, top_k=40, seed=0,
                                                ignore_eos=True))[0].outputs[0].token_ids
    ours = paged_logits(quant, ids, 16)[:-1].argmax(-1)
    del quant
    ref = LLM(str(path), engine_process=False, device="cuda", dtype=torch.float32, quantization="none", max_num_seqs=1, kv_cache_memory_gb=2)
    theirs = paged_logits(ref, ids, len(ids))[:-1].argmax(-1)
    del ref
    torch.cuda.empty_cache()
    return float((ours == theirs).float().mean())


def main() -> None:
    import argparse

    from mlxr.testing.fixtures import fixture_paths

    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", nargs="*", metavar="TYPE=DECODE,PREFILL",
                    help="llama.cpp's tok/s from the same lease for q8_0, q4_k_m and f16")
    peers = peer_figures(ap.parse_args().llama_cpp)

    files = {t: gguf_file(t) for t in ("q8_0", "q4_k_m")}
    rows = [speed(str(files[t]), None, peers.get(t), f"GGUF {t.upper()}") for t in files]
    hf_dir = str(fixture_paths("tinyllama-shape", ROOT / ".fixtures").hf_dir)
    rows.append(speed(hf_dir, "fp8", peers.get("f16"), "FP8 E4M3 from bf16 (vs llama.cpp F16)"))
    rows.append(speed(hf_dir, None, peers.get("f16"), "bf16 (vs llama.cpp F16)"))
    agree = {t: agreement(p) for t, p in files.items()}
    path = write_result("gpu_quant", {"model": "tinyllama-shape", "device": device_name("cuda"),
                                      "results": rows, "top1_agreement_fp32": agree})
    print_table(rows, ["weights", "decode_tok_s", "llama_cpp_decode", "decode_ratio",
                       "prefill_512_tok_s", "llama_cpp_prefill", "prefill_ratio"])
    print("teacher-forced top-1 agreement with the fp32 dequantized path:", agree)
    print(path)


if __name__ == "__main__":
    main()
