"""CPU speed of the extra kept-quantized types (Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, NF4).

  python bench/kernels/quant_extra.py --kernels-only              # kernel rows only (no llama.cpp)
  python bench/kernels/quant_extra.py --site /tmp/lcpp/lib/python3.11/site-packages --runs 3
  python bench/kernels/quant_extra.py --kernels-only --device cuda  # the Triton kernels (bf16 x)

Kernel rows: one (5632 x 2048) quantized matrix times --m activation rows (decode: m=1), median
of --repeats, as GB/s of weight bytes, beside the core Q4_0 and Q4_K kernels for scale.
Model rows (needs llama-cpp-python, installed apart; --site): a mid-size random Llama (hidden
1024, 8 layers, vocab 32000; written once under .fixtures/) quantized by llama.cpp's own
quantizer (llama_model_quantize, --pure: every tensor of the type) to each GGUF type; then on
the same file, interleaved run by run, MLXR and llama.cpp: 128-token prompt, --gen greedy
tokens, --threads threads. JSON to bench/results/quant_extra-*.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import device_name, median, print_table, sync, write_result
from latency import bench_mlxr, prompt_ids

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / ".fixtures" / "bench-mid-quantized"
# llama.cpp's LLAMA_FTYPE_MOSTLY_* of each type
FTYPES = {"Q4_1": 3, "Q5_1": 9, "Q2_K": 10, "Q3_K": 11, "IQ4_NL": 25, "IQ4_XS": 30}
MID = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
           num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024)


def kernel_rows(types: list[str], ms: list[int], repeats: int, device: str = "cpu") -> list[dict]:
    from mlxr.ops.quant.block_types import quant_type
    from mlxr.ops.quant.quant import qmatmul

    sys.path.insert(0, str(ROOT / "tests"))
    from quant_blocks import F16_FIELDS, random_blocks

    rows, n, k = [], 5632, 2048
    for qtype in ["Q4_0", "Q4_K", *types]:
        raw = torch.from_numpy(random_blocks(qtype, n, k) if qtype in F16_FIELDS or qtype == "NF4"
                               else np.zeros((n, quant_type(qtype).row_bytes(k)), np.uint8)).to(device)
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
            times = []
            for _ in range(repeats):
                sync(device)
                t0 = time.perf_counter()
                qmatmul(x, raw, qtype, k)
                sync(device)
                times.append(time.perf_counter() - t0)
            sec = median(times[3:])
            rows.append({"kernel": f"{qtype} {n}x{k} m={m}", "device": device, "ms": sec * 1e3,
                         "GB_s": raw.numel() / sec / 1e9})
    return rows


def f16_source() -> Path:
    from mlxr.testing import fixture_tokenizer as ft
    from mlxr.testing.fixtures import CONFIGS, FixtureSpec, _llama_config, fixture_paths

    CONFIGS.setdefault("bench-mid", FixtureSpec("llama", _llama_config(**MID), ft.LLAMA, weight_std=0.02,
                                                gguf_type="f16"))
    return fixture_paths("bench-mid", ROOT / ".fixtures").gguf_path


def quantized_file(qtype: str) -> Path:
    import llama_cpp

    path = FILES / f"bench-mid-{qtype.lower()}-pure.gguf"
    if not path.exists():
        FILES.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread, params.pure = FTYPES[qtype], 2, True
        tmp = path.with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(str(f16_source()).encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError(f"llama_model_quantize failed for {qtype}")
        tmp.rename(path)
    return path


def model_row(qtype: str, runs: int, gen: int, threads: int) -> dict:
    from llama_cpp import Llama
    from llama_cpp_cpu import run_once

    from mlxr import LLM

    path = quantized_file(qtype)
    ours = LLM(str(path), max_num_seqs=1, enable_prefix_caching=False)
    peer = Llama(str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    prompt = prompt_ids(ours.args.vocab_size, 128)
    run_once(peer, prompt, 4)
    mine, theirs = [], []
    for _ in range(runs):  # interleaved: one run each, in turn
        mine.append(bench_mlxr(ours, "cpu", prompt, gen, 1))
        theirs.append(run_once(peer, prompt, gen))
    decode, peer_decode = median([r["decode_tok_s"] for r in mine]), median([r[1] for r in theirs])
    return {"type": qtype, "file": path.name, "mlxr_prefill": median([r["prefill_tok_s"] for r in mine]),
            "llama_cpp_prefill": median([r[0] for r in theirs]), "mlxr_decode": decode,
            "llama_cpp_decode": peer_decode, "decode_ratio": decode / peer_decode,
            "runs_mlxr": mine, "runs_llama_cpp": [list(r) for r in theirs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="*", default=[*FTYPES, "NF4"])
    p.add_argument("--m", type=int, nargs="*", default=[1, 4])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--kernels-only", action="store_true")
    p.add_argument("--site", default=None, help="site-packages holding llama_cpp (its own venv)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="kernel rows on cpu (C kernels) or cuda (Triton)")
    ns = p.parse_args()
    torch.set_num_threads(ns.threads)
    kernels = kernel_rows(ns.types, ns.m, ns.repeats, ns.device)
    print_table(kernels, ["kernel", "ms", "GB_s"])
    models = []
    if not ns.kernels_only:
        if ns.site:
            sys.path.append(ns.site)
        models = [model_row(t, ns.runs, ns.gen, ns.threads) for t in ns.types if t in FTYPES]
        print_table(models, ["type", "mlxr_prefill", "llama_cpp_prefill", "mlxr_decode", "llama_cpp_decode",
                             "decode_ratio"])
    path = write_result("quant_extra", {"device": device_name(ns.device), "threads": ns.threads, "prompt_len": 128,
                                        "gen_len": ns.gen, "kernels": kernels, "models": models})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
