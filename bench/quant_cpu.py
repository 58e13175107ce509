"""Quantized GGUF inference on the CPU: MLXR alone on the GGUF files (bench/peers/cpu_vs_llama_cpp.py
runs this and llama.cpp interleaved on the same files and gives the ratios).

  python bench/quant_cpu.py                 # Gemma 3 270M Q4_K_M + TinyLlama shape Q8_0/Q4_K_M
  python bench/quant_cpu.py --models gemma3-270m --runs 5

Single stream: 128-token prompt, 64 generated tokens, median of --runs. Batched: 8 concurrent
requests, decode tok/s over all of them. Kernel rows time
one quantized matrix-vector product per type at the TinyLlama shape. The TinyLlama files are
written once by `mlxr quantize` from the f16 fixture into .fixtures/tinyllama-quantized/.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from common import device_name, median, print_table, write_result
from latency import bench_mlxr, prompt_ids

ROOT = Path(__file__).resolve().parent.parent
TINYLLAMA_DIR = ROOT / ".fixtures" / "tinyllama-quantized"
MODELS = ["gemma3-270m", "tinyllama-shape-q8_0", "tinyllama-shape-q4_k_m"]  # llama.cpp beside them: bench/peers/cpu_vs_llama_cpp.py


def model_file(name: str) -> str:
    """A registry name (gemma3-270m, smollm2:135m) as it is; tinyllama-shape-<type> written once."""
    if not name.startswith("tinyllama-shape-"):
        return name
    file_type = name.rsplit("-", 1)[1]
    path = TINYLLAMA_DIR / f"{name}.gguf"
    if not path.exists():
        from mlxr.testing.fixtures import fixture_paths

        src = fixture_paths("tinyllama-shape", ROOT / ".fixtures").gguf_path
        TINYLLAMA_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "mlxr.cli", "quantize", str(src), "--type", file_type, str(path)],
                       check=True, stdout=subprocess.DEVNULL)
    return str(path)


def batched_decode(llm, vocab: int, batch: int, gen: int) -> float:
    from mlxr import SamplingParams

    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    engine = llm.engine
    for i in range(batch):
        engine.add_request(f"batch-{i}", prompt_ids(vocab, 128 + batch)[i:i + 128], params, stream_deltas=True)
    first, n = None, 0
    while engine.has_unfinished():
        outs = engine.step()
        n += sum(len(o.outputs[0].token_ids) for o in outs)
        if first is None and n >= batch:
            first, at_first = time.perf_counter(), n
    return (n - at_first) / (time.perf_counter() - first)


def bench_model(name: str, runs: int, batch: int) -> dict:
    from mlxr import LLM

    # No prefix caching: every run repeats the prompt, and prefill must time all 128 tokens.
    llm = LLM(model_file(name), max_num_seqs=max(batch, 1), enable_prefix_caching=False)
    vocab = llm.args.vocab_size
    row = {"model": name, "quantization": llm.loaded.quantization,
           **bench_mlxr(llm, "cpu", prompt_ids(vocab, 128), 64, runs)}
    if batch > 1:
        row[f"batch{batch}_decode_tok_s"] = batched_decode(llm, vocab, batch, 32)
    return row


def bench_kernels(repeats: int = 50, ms: tuple[int, ...] = (1,), types: list[str] | None = None) -> list[dict]:
    import numpy as np

    from mlxr.ops.quant.block_types import QUANT_TYPES
    from mlxr.ops.quant.cpu import qmatmul_cpu

    rows = []
    rng = np.random.default_rng(0)
    for qtype, t in QUANT_TYPES.items():
        if types and qtype not in types:
            continue
        n, k = 5632, 2048
        raw = torch.from_numpy(rng.integers(0, 256, (n, t.row_bytes(k)), dtype=np.uint8))
        raw.view(-1, t.block_bytes)[:, :2] = torch.tensor([0x00, 0x1C], dtype=torch.uint8)  # d = 2^-8
        if qtype == "Q6_K":
            raw.view(-1, t.block_bytes)[:, 208:] = torch.tensor([0x00, 0x1C], dtype=torch.uint8)
        for m in ms:
            x = torch.randn(m, k)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                qmatmul_cpu(x, raw, qtype, k)
                times.append(time.perf_counter() - t0)
            sec = median(times[5:])
            rows.append({"model": f"kernel {qtype} {n}x{k} m={m}", "ms": sec * 1e3, "GB_s": raw.numel() / sec / 1e9})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=MODELS)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--kernels-only", action="store_true", help="time the kernel rows only, no model runs")
    p.add_argument("--m", type=int, nargs="*", default=[1], help="activation rows of the kernel rows")
    p.add_argument("--types", nargs="*", default=None, help="kernel rows of these types only")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--threads", type=int, default=None, help="default: torch's (every CPU this process may use)")
    ns = p.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    rows = [] if ns.kernels_only else [bench_model(m, ns.runs, ns.batch) for m in ns.models]
    kernels = bench_kernels(ns.repeats, tuple(ns.m), ns.types)
    if ns.kernels_only:
        print_table(kernels, ["model", "ms", "GB_s"])
        return
    path = write_result("quant_cpu", {"device": device_name("cpu"), "prompt_len": 128, "gen_len": 64,
                                      "runs": ns.runs,
                                      "models": rows, "kernels": kernels})
    print_table(kernels, ["model", "ms", "GB_s"])
    print_table(rows, ["model", "prefill_tok_s", "decode_tok_s", f"batch{ns.batch}_decode_tok_s"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
