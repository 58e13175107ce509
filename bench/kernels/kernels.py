"""Kernel microbenchmarks: each Triton kernel's achieved GB/s (or TFLOP/s) beside the device's
ceilings measured in the same run (device-to-device copy; bf16 matmul) and beside the torch
reference (or SDPA for prefill). Kernel times are CUDA-graph replays (triton's
do_bench_cudagraph, median). Writes bench/results/kernels-*.json and prints a table last.

  python bench/kernels/kernels.py                  # all kernels, default shapes
  python bench/kernels/kernels.py --only sweep     # the attention kernels' launch knobs
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
import triton
import triton.testing

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import device_name, print_table, write_result
from mlxr.ops.activation.activation import activation_reference
from mlxr.ops.activation.activation_triton import gated_activation_triton
from mlxr.ops.attention.attn_metadata import AttnMetadata
from mlxr.ops.attention.paged_attention import paged_attention_reference, paged_decode_reference, write_kv
from mlxr.ops.attention.paged_decode_triton import paged_decode_triton
from mlxr.ops.attention.paged_prefill_triton import paged_prefill_triton
from mlxr.ops.norm.rms_norm import rms_norm_reference
from mlxr.ops.norm.rms_norm_triton import rms_norm_triton
from mlxr.ops.rotary.rotary import rotary_reference
from mlxr.ops.rotary.rotary_triton import rotary_triton

DT = torch.bfloat16
ROTATE_BYTES = 512 << 20  # rotate inputs until one timed replay touches this much (> L2)


def time_ms(fn: Callable[[], object], graph: bool = True) -> float:
    if graph:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
        except Exception as e:  # noqa: BLE001 (the reference may not be capturable)
            print(f"  (no graph: {type(e).__name__}: {e})"[:200])
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def ceilings() -> dict:
    n = 1 << 29  # 1 GiB of bf16 each way
    src, dst = torch.randn(n, device="cuda", dtype=DT), torch.empty(n, device="cuda", dtype=DT)
    copy_ms = time_ms(lambda: dst.copy_(src), graph=False)
    del src, dst
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=DT) for _ in range(2))
    mm_ms = time_ms(lambda: a @ b, graph=False)
    return {"copy_GBps": 2 * 2 * n / copy_ms / 1e6, "matmul_bf16_TFLOPs": 2 * 8192**3 / mm_ms / 1e9}


def paged_setup(q_lens, seq_lens, heads, dim, bs, copies: int) -> tuple[torch.Tensor, torch.Tensor, list[AttnMetadata]]:
    """A bf16 cache holding `copies` disjoint sets of the sequences (scattered blocks)."""
    n_heads, n_kv = heads
    per_seq = [-(-s // bs) for s in seq_lens]
    total = sum(per_seq) * copies
    kc = torch.randn(total, bs, n_kv, dim, device="cuda", dtype=DT)
    vc = torch.randn_like(kc)
    perm = torch.randperm(total).tolist()
    metas = []
    for _ in range(copies):
        tables = [[perm.pop() for _ in range(n)] for n in per_seq]
        width = max(per_seq)
        as_t = lambda x: torch.tensor(x, device="cuda")  # noqa: E731
        metas.append(AttnMetadata(
            slot_mapping=as_t([0]), block_tables=as_t([t + [0] * (width - len(t)) for t in tables]),
            query_start_loc=as_t([0] + torch.tensor(q_lens).cumsum(0).tolist()),
            seq_lens=as_t(seq_lens), query_lens_list=list(q_lens), seq_lens_list=list(seq_lens),
            block_size=bs,
        ))
    return kc, vc, metas


def decode_row(name, n_seqs, ctx, heads, dim, bs=16, window=None, ceil=None, **knobs) -> dict:
    knobs = {k: v for k, v in knobs.items() if v is not None}
    n_heads, n_kv = heads
    visible = min(ctx, window) if window else ctx
    kv_bytes = 2 * n_seqs * visible * n_kv * dim * 2
    copies = max(1, min(64, math.ceil(ROTATE_BYTES / (2 * n_seqs * ctx * n_kv * dim * 2))))
    kc, vc, metas = paged_setup([1] * n_seqs, [ctx] * n_seqs, heads, dim, bs, copies)
    q = torch.randn(n_seqs, n_heads, dim, device="cuda", dtype=DT)
    scale = dim**-0.5

    def fast() -> None:
        for m in metas:
            paged_decode_triton(q, kc, vc, m.block_tables, m.seq_lens, scale, window, **knobs)

    def ref() -> None:
        for m in metas:
            paged_decode_reference(q, kc, vc, m, scale, window)

    ms = time_ms(fast) / copies
    ref_ms = time_ms(ref) / copies if not knobs and n_seqs * ctx <= 1 << 20 else None
    gbps = (kv_bytes + 2 * q.numel() * 2) / ms / 1e6
    del kc, vc
    return report({"kernel": "decode_attn", "shape": name, "us": 1e3 * ms, "GB/s": gbps, "knobs": str(knobs or ""),
                   "%ceil": 100 * gbps / ceil["copy_GBps"], "ref_us": ref_ms and 1e3 * ref_ms,
                   "speedup": ref_ms and ref_ms / ms})


def causal_pairs(q_lens, seq_lens, window) -> int:
    pairs = 0
    for ql, sl in zip(q_lens, seq_lens):
        for pos in range(sl - ql, sl):
            pairs += min(pos + 1, window) if window else pos + 1
    return pairs


def prefill_row(name, q_lens, seq_lens, heads, dim, bs=16, window=None, ceil=None, **knobs) -> dict:
    n_heads, n_kv = heads
    kc, vc, metas = paged_setup(q_lens, seq_lens, heads, dim, bs, 1)
    m = metas[0]
    q = torch.randn(sum(q_lens), n_heads, dim, device="cuda", dtype=DT)
    args = (q, kc, vc, m.block_tables, m.seq_lens, m.query_start_loc, max(q_lens), dim**-0.5, window)
    ms = time_ms(lambda: paged_prefill_triton(*args, **knobs))
    tflops = 4 * dim * n_heads * causal_pairs(q_lens, seq_lens, window) / ms / 1e9
    row = {"kernel": "prefill_attn", "shape": name, "us": 1e3 * ms, "TFLOP/s": tflops, "knobs": str(knobs or ""),
           "%ceil": 100 * tflops / ceil["matmul_bf16_TFLOPs"]}
    if not knobs:
        # The peer: torch SDPA (flash) on contiguous K/V for fresh prompts, else the reference.
        fresh = q_lens == seq_lens and window is None
        ref_ms = sdpa_ms(q_lens, heads, dim) if fresh else time_ms(
            lambda: paged_attention_reference(q, kc, vc, m, dim**-0.5, window))
        row.update({"ref": "sdpa" if fresh else "torch ref", "ref_us": 1e3 * ref_ms, "speedup": ref_ms / ms})
    return report(row)


def sdpa_ms(q_lens, heads, dim) -> float:
    n_heads, n_kv = heads
    qs = [torch.randn(1, n_heads, n, dim, device="cuda", dtype=DT) for n in q_lens]
    ks = [torch.randn(1, n_kv, n, dim, device="cuda", dtype=DT).repeat_interleave(n_heads // n_kv, 1) for n in q_lens]
    F = torch.nn.functional
    return time_ms(lambda: [F.scaled_dot_product_attention(q, k, k, is_causal=True) for q, k in zip(qs, ks)])


def elementwise_rows(ceil: dict) -> list[dict]:
    rows, hidden, inter, t = [], 2048, 5632, 32768  # each tensor over twice the L2
    x, res = (torch.randn(t, hidden, device="cuda", dtype=DT) for _ in range(2))
    w = torch.randn(hidden, device="cuda", dtype=DT)
    rows.append(bw_row("rms_norm+residual", f"{t}x{hidden}", 4 * x.numel() * 2, ceil,
                       lambda: rms_norm_triton(x, w, 1e-6, False, res),
                       lambda: rms_norm_reference(x + res, w, 1e-6, False)))
    gu = torch.randn(t, 2 * inter, device="cuda", dtype=DT)
    g, u = gu[:, :inter], gu[:, inter:]
    rows.append(bw_row("gated_silu", f"{t}x2x{inter}", 3 * t * inter * 2, ceil,
                       lambda: gated_activation_triton(g, u, "silu"),
                       lambda: activation_reference(g, "silu") * u))
    rows.append(rope_row(ceil, t, (32, 4), 64))
    rows.append(rope_row(ceil, t, (32, 8), 128))
    return rows


def rope_row(ceil: dict, t: int, heads: tuple[int, int], dim: int) -> dict:
    n_heads, n_kv = heads
    q = torch.randn(t, n_heads, dim, device="cuda", dtype=DT)
    k, v = (torch.randn(t, n_kv, dim, device="cuda", dtype=DT) for _ in range(2))
    pos = torch.randint(0, 8192, (t,), device="cuda")
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
    kc, vc = (torch.empty(t // 16 + 1, 16, n_kv, dim, device="cuda", dtype=DT) for _ in range(2))
    slots = torch.randperm(t, device="cuda")
    nbytes = (2 * n_heads + 5 * n_kv) * t * dim * 2

    def ref() -> None:
        qr, kr = rotary_reference(q, k, pos, inv)
        write_kv(kr, v, kc, vc, slots)

    return bw_row("rope+kv_write", f"{t}x{n_heads}/{n_kv}x{dim}", nbytes, ceil,
                  lambda: rotary_triton(q, k, pos, inv, (v, kc, vc, slots)), ref)


def bw_row(kernel, shape, nbytes, ceil, fast, ref) -> dict:
    ms, ref_ms = time_ms(fast), time_ms(ref)
    gbps = nbytes / ms / 1e6
    return report({"kernel": kernel, "shape": shape, "us": 1e3 * ms, "GB/s": gbps,
                   "%ceil": 100 * gbps / ceil["copy_GBps"], "ref_us": 1e3 * ref_ms, "speedup": ref_ms / ms})


def report(row: dict) -> dict:
    print("  " + "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                           if v not in (None, "")), flush=True)
    return row


TINY, L8B, GEMMA = (32, 4), (32, 8), (4, 1)  # (query heads, KV heads): TinyLlama, Llama-8B, Gemma3 270M


def decode_rows(ceil: dict) -> list[dict]:
    cases = [
        ("tinyllama b1 ctx32k", 1, 32768, TINY, 64, {}),
        ("tinyllama b1 ctx4k", 1, 4096, TINY, 64, {}),
        ("tinyllama b64 ctx4k", 64, 4096, TINY, 64, {}),
        ("tinyllama b256 ctx256", 256, 256, TINY, 64, {}),
        ("tinyllama b256 ctx1k", 256, 1024, TINY, 64, {}),
        ("tinyllama b64 ctx4k bs1", 64, 4096, TINY, 64, {"bs": 1}),
        ("tinyllama b64 ctx4k bs32", 64, 4096, TINY, 64, {"bs": 32}),
        ("llama8b b1 ctx32k", 1, 32768, L8B, 128, {}),
        ("llama8b b32 ctx8k", 32, 8192, L8B, 128, {}),
        ("gemma270m b1 ctx32k", 1, 32768, GEMMA, 256, {}),
        ("gemma270m b64 ctx4k win512", 64, 4096, GEMMA, 256, {"window": 512}),
    ]
    return [decode_row(n, s, c, h, d, ceil=ceil, **kw) for n, s, c, h, d, kw in cases]


def prefill_rows(ceil: dict) -> list[dict]:
    cases = [
        ("tinyllama 1x512", [512], [512], TINY, 64, {}),
        ("tinyllama 4x2048", [2048] * 4, [2048] * 4, TINY, 64, {}),
        ("tinyllama chunk512 on 3584", [512], [4096], TINY, 64, {}),
        ("llama8b 1x4096", [4096], [4096], L8B, 128, {}),
        ("gemma270m 2x4096 win512", [4096] * 2, [4096] * 2, GEMMA, 256, {"window": 512}),
    ]
    return [prefill_row(n, q, s, h, d, ceil=ceil, **kw) for n, q, s, h, d, kw in cases]


def sweep_rows(ceil: dict) -> list[dict]:
    rows = []
    for bn in (32, 64, 128):
        for warps, stages in ((4, 2), (4, 3), (8, 3)):
            for pt in (None, 512, 256):
                knobs = {"block_n": bn, "num_warps": warps, "num_stages": stages}
                rows.append(decode_row("llama8b b1 ctx32k", 1, 32768, L8B, 128, ceil=ceil, part_tokens=pt, **knobs))
        rows.append(decode_row("tinyllama b64 ctx4k", 64, 4096, TINY, 64, ceil=ceil, block_n=bn))
        for warps in (2, 4):
            rows.append(decode_row("tinyllama b256 ctx256", 256, 256, TINY, 64, ceil=ceil, block_n=bn, num_warps=warps))
    for pt in (None, 512, 256):
        rows.append(decode_row("tinyllama b1 ctx32k", 1, 32768, TINY, 64, ceil=ceil, part_tokens=pt))
        for bn in (32, 64):
            rows.append(decode_row("gemma270m b1 ctx32k", 1, 32768, GEMMA, 256, ceil=ceil, part_tokens=pt, block_n=bn))
    for bm, bn, warps, stages in ((128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
                                  (64, 64, 4, 3), (128, 64, 4, 3), (128, 32, 4, 3), (64, 128, 4, 2)):
        knobs = {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages}
        rows.append(prefill_row("tinyllama 4x2048", [2048] * 4, [2048] * 4, TINY, 64, ceil=ceil, **knobs))
        rows.append(prefill_row("llama8b 1x4096", [4096], [4096], L8B, 128, ceil=ceil, **knobs))
    for bm, bn, warps, stages in ((64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (64, 32, 4, 3)):
        knobs = {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages}
        rows.append(prefill_row("gemma270m 2x4096 win512", [4096] * 2, [4096] * 2, GEMMA, 256, window=512,
                                ceil=ceil, **knobs))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--only", choices=["decode", "prefill", "elementwise", "sweep"], default=None,
                   help="one part; the sweep of the attention launch knobs runs only when named")
    args = p.parse_args()
    torch.manual_seed(0)
    ceil = ceilings()
    print(f"{device_name('cuda')}: copy {ceil['copy_GBps']:,.0f} GB/s, bf16 matmul {ceil['matmul_bf16_TFLOPs']:,.0f} TFLOP/s")
    parts = {"decode": decode_rows, "prefill": prefill_rows, "elementwise": elementwise_rows, "sweep": sweep_rows}
    names = [args.only] if args.only else ["decode", "prefill", "elementwise"]
    rows = [row for name in names for row in parts[name](ceil)]
    name = "kernels-sweep" if args.only == "sweep" else "kernels"
    path = write_result(name, {"device": device_name("cuda"), "triton": triton.__version__, "dtype": "bfloat16",
                               "ceilings": ceil, "rows": rows})
    print_table(rows, ["kernel", "shape", "knobs", "us", "GB/s", "TFLOP/s", "%ceil", "ref_us", "speedup"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
