"""Paged decode attention at batch 64 and 256 with short contexts (the batched-decode sweep's
shape: TinyLlama heads, ~200 tokens of context, a block table as wide as the model's context)
over partition sizes, tile widths and launch knobs, timed inside a CUDA graph. Finds whether
the default plan (partitions sized from the block table's width) leaves the device idle when
contexts are much shorter than the table. JSON to bench/results/decode_attn_sweep-*.json.

  python bench/probes/decode_attn_sweep.py [--ctx 200] [--span 2048]
"""
from __future__ import annotations

import argparse
import itertools

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import device_name, print_table, write_result
from gemv import graph_us


def main() -> None:
    from mlxr.ops.attention.paged_decode_triton import paged_decode_triton

    p = argparse.ArgumentParser()
    p.add_argument("--ctx", type=int, default=200)
    p.add_argument("--span", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=16)
    a = p.parse_args()
    heads, kv, dim, bs = 32, 4, 64, a.block_size
    rows, best = [], []
    for batch in (64, 256):
        width = a.span // bs
        blocks = batch * width + 1
        # One cache per layer, as in a step: each call reads K/V that are not in L2.
        caches = [(torch.randn(blocks, bs, kv, dim, dtype=torch.bfloat16, device="cuda"),
                   torch.randn(blocks, bs, kv, dim, dtype=torch.bfloat16, device="cuda")) for _ in range(22)]
        k, v = caches[0]
        # Scattered blocks, as the block manager hands them out after some churn.
        table = torch.randperm(batch * width, device="cuda").to(torch.int32).view(batch, width)
        lens = torch.full((batch,), a.ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, heads, dim, dtype=torch.bfloat16, device="cuda")
        ref = paged_decode_triton(q, k, v, table, lens, dim ** -0.5)
        cands = []
        for part, bn, warps, stages in itertools.product((None, 32, 64, 128, 256), (32, 64, 128), (2, 4, 8), (2, 3)):
            if part is not None and part % bn:
                continue
            kw = dict(part_tokens=part, block_n=bn, num_warps=warps, num_stages=stages)
            try:
                err = float((paged_decode_triton(q, k, v, table, lens, dim ** -0.5, **kw).float() - ref.float()).abs().max())
                us = graph_us([lambda c=c: paged_decode_triton(q, *c, table, lens, dim ** -0.5, **kw) for c in caches],
                              calls=22)
            except Exception as e:  # a launch the device cannot hold
                print("skip", kw, type(e).__name__)
                continue
            cands.append({"batch": batch, **{k2: str(v2) for k2, v2 in kw.items()}, "us": us, "max_err": err})
        rows += cands
        default = next(c for c in cands if c["part_tokens"] == "None" and c["block_n"] == "128"
                       and c["num_warps"] == "4" and c["num_stages"] == "2")
        top = sorted(cands, key=lambda r: r["us"])[:5]
        best += [{**t, "default_us": default["us"]} for t in top]
    path = write_result("decode_attn_sweep", {"device": device_name("cuda"), "ctx": a.ctx, "span": a.span,
                                              "results": rows, "best": best})
    print_table(best, ["batch", "part_tokens", "block_n", "num_warps", "num_stages", "us", "default_us", "max_err"])
    print(path)


if __name__ == "__main__":
    main()
