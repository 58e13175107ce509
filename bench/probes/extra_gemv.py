"""The extra types' decode GEMV (quant/extra_triton.qmatmul_extra_triton, up to 16 rows of x in
one program) against the path SmolLM2's K = 576 linears took before it: dequantize the whole
weight (dequantize_extra_triton, in x's dtype) + torch's matmul. SmolLM2-135M's merged decode
matrices (n x k): qkv 960x576 (9 + 2*3 heads of 64), o 576x576, gate_up 3072x576, down 576x1536.

Each time is the median of --reps CUDA-graph replays timed with torch.cuda.Event, a graph holding
one call per weight copy, the copies cycled past L2 (a decode step reads each weight once;
--warm: one L2-resident copy), divided by the calls. Every --variant (launch knobs bn, bk,
warps, split: qmatmul_extra_triton's config) runs at every row count: the GEMV must keep one config
per shape for all rows (a row's sums may not change with the batch), so pick the variant with
the lowest sum over the rows that matter. Also checks each variant on the GPU: the result
against the old path, and a row alone bit-identical to the same row inside a 9-row batch.
For down (K = 1536) the old path was a GEMV launching one program per row of x (the previous
commit's graph_launch.py measures whole steps); "old" here is dequantize + cuBLAS throughout.
About 5 minutes on an H100 with the default sweep, most of it compiling (a kernel per row count);
--shapes / --rows / --variant narrow it.

  python bench/probes/extra_gemv.py [--rows 1 2 4 9 16] [--variant bn=8,warps=2[,split=1] ...] [--qtype Q4_1]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, print_table, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # quant_blocks: random blocks of any type
from quant_blocks import random_blocks  # noqa: E402

from mlxr.ops.quant.extra_triton import (  # noqa: E402
    dequantize_extra_triton,
    gemv_config,
    qmatmul_extra_triton,
)
from mlxr.ops.quant.block_types import EXTRA_TYPES  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LAYERS = 30  # SmolLM2-135M: a step runs each shape once a layer
DEVICE = "cuda"
# Without split: gemv_config's split-K (to _PROGRAMS_PER_SM programs a multiprocessor); split=1: none.
# Each keeps BN * BK / (32 * warps) <= 8 weights a thread: at 16 rows, 16 (e.g. bn=8,warps=1)
# spill registers in the sm_90 code.
VARIANTS = ["bn=4,warps=1", "bn=4,warps=2", "bn=16,warps=4", "bn=32,warps=8", "bn=8,bk=32,warps=1",
            "bn=16,bk=32,warps=2", "bn=4,warps=1,split=1", "bn=8,warps=2,split=1", "bn=16,warps=4,split=1"]
L2_MISS_BYTES = 128 << 20  # H100: 50 MB of L2


def parse_variant(text: str) -> dict:
    """'bn=8,bk=64,warps=2,split=1' -> {'bn': 8, 'bk': 64, 'warps': 2, 'split': 1}; 'default' -> {}; halves=1: Q4_1's two-half tile."""
    if text == "default":
        return {}
    cfg = {}
    for part in text.split(","):
        key, value = part.split("=")
        assert key in ("bn", "bk", "warps", "split", "halves"), key
        cfg[key] = int(value)
    return cfg


def graph_us(fns: list, reps: int) -> float:
    """Median device microseconds per call of one replay of a graph calling every fn once."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    for _ in range(10):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(fns))
    return sorted(times)[len(times) // 2]


def weight_copies(qtype: str, n: int, k: int, warm: bool) -> list[torch.Tensor]:
    one = torch.from_numpy(random_blocks(qtype, n, k, seed=n + k)).to(DEVICE)
    copies = 1 if warm else max(2, min(512, -(-L2_MISS_BYTES // one.numel())))
    return [one] + [one.clone() for _ in range(copies - 1)]


def old_path(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """What K = 576 took before: the whole weight dequantized in x's dtype, then cuBLAS."""
    return x @ dequantize_extra_triton(raw, qtype, k, x.dtype).T


def check(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, cfg: dict) -> tuple[float, bool]:
    """(relative error against the float32 old path, row 3 of a 9-row batch == that row alone)."""
    ref = old_path(x.float(), raw, qtype, k).double()
    got = qmatmul_extra_triton(x, raw, qtype, k, config=cfg).double()
    err = ((got - ref).norm() / ref.norm()).item()
    batch = torch.randn(9, k, device=x.device, dtype=x.dtype)
    batch[3] = x[0]
    same = torch.equal(qmatmul_extra_triton(batch, raw, qtype, k, config=cfg)[3],
                       qmatmul_extra_triton(x[:1], raw, qtype, k, config=cfg)[0])
    return err, same


def shape_rows(name: str, n: int, k: int, args, variants: list[str]) -> list[dict]:
    ws = weight_copies(args.qtype, n, k, args.warm)
    gb = ws[0].numel() / 1e9
    rows = []
    for m in args.rows:
        x = torch.randn(m, k, device=DEVICE, dtype=args.dtype)
        old = graph_us([lambda w=w: old_path(x, w, args.qtype, k) for w in ws], args.reps)
        print(f"{name} {n}x{k}, {m} rows: {len(ws)} weight copies, old path {old:.1f} us", flush=True)
        for text in variants:
            cfg = parse_variant(text)
            bn, bk, warps, split, _ = gemv_config(n, k, x.device, cfg)
            try:
                calls = [lambda w=w: qmatmul_extra_triton(x, w, args.qtype, k, config=cfg) for w in ws]
                us = graph_us(calls, args.reps)
            except Exception as e:  # noqa: BLE001 - a config the compiler refuses (registers)
                print(f"{name} m={m} {text}: {type(e).__name__}: {e}"[:200])
                continue
            err, same = check(x, ws[0], args.qtype, k, cfg)
            rows.append({"op": name, "n": n, "k": k, "rows": m, "variant": text,
                         "launch": f"BN{bn} BK{bk} w{warps} split{split}",
                         "gemv_us": us, "old_us": old, "speedup": old / us, "GB_s": gb / us * 1e6,
                         "rel_err": err, "row_identical": same})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per variant and row count: the four shapes' GEMVs summed, times LAYERS (a step's share)."""
    out = {}
    for r in rows:
        key = (r["variant"], r["rows"])
        s = out.setdefault(key, {"variant": r["variant"], "rows": r["rows"], "step_gemv_us": 0.0, "step_old_us": 0.0})
        s["step_gemv_us"] += r["gemv_us"] * LAYERS
        s["step_old_us"] += r["old_us"] * LAYERS
    return sorted(out.values(), key=lambda s: (s["rows"], s["step_gemv_us"]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 9, 16])
    p.add_argument("--variant", action="append", help="launch knobs, e.g. bn=8,bk=64,warps=2,split=1 (repeatable; "
                   "'default' for the built-in config); default: a small sweep")
    p.add_argument("--qtype", default="Q4_1", choices=list(EXTRA_TYPES))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--warm", action="store_true", help="one weight copy, L2-resident")
    args = p.parse_args()
    args.dtype = getattr(torch, args.dtype)
    variants = list(dict.fromkeys(["default", *(args.variant or VARIANTS)]))
    rows = [r for name in args.shapes for r in shape_rows(name, *SHAPES[name], args, variants)]
    steps = summary(rows)
    path = write_result("extra_gemv", {"device": device_name(DEVICE), "qtype": args.qtype, "dtype": str(args.dtype),
                                       "l2": "warm" if args.warm else "cold", "reps": args.reps,
                                       "results": rows, "per_step": steps})
    shown = [{**r, "rel_err": f"{r['rel_err']:.1e}"} for r in rows]
    print_table(shown, ["op", "rows", "variant", "launch", "gemv_us", "old_us", "speedup", "GB_s", "rel_err",
                        "row_identical"])
    print()
    print_table(steps, ["rows", "variant", "step_gemv_us", "step_old_us"])
    totals = {}
    for s in steps:
        totals[s["variant"]] = totals.get(s["variant"], 0.0) + s["step_gemv_us"]
    best = min(totals, key=totals.get)
    print(f"\nlowest step GEMV time summed over rows {args.rows}: {best} ({totals[best]:,.1f} us) -> {path}")
    if not all(r["row_identical"] for r in rows):
        print("WARNING: a variant's row differed between a 9-row batch and alone (see row_identical)")


if __name__ == "__main__":
    main()
