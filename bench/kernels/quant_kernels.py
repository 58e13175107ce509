"""GGUF block kernels (mlxr/ops/quant/core_triton.py) on the GPU: achieved GB/s of weight bytes (and
TFLOP/s from 128 rows) of qmatmul_triton beside bf16 torch.matmul on the dequantized weight.

Each time is the median of 50 CUDA-event-timed replays of a CUDA graph that runs the op once per
copy of the weight, over enough copies (up to 64) that one replay reads twice the L2: the
weights come from HBM, as in a model, and launch gaps are the graph's. A second table times
both GEMM paths (fused tensor-core kernel, dequantize + cuBLAS) from 128 to 2048 rows, which is
why qmatmul_triton takes the latter; `--sweep` first times launch knobs (checking each result)
and runs the table with the best.
Writes bench/results/quant_kernels_<device>.json (and a copy under --out) and prints a table.

  python bench/kernels/quant_kernels.py                      # the table
  python bench/kernels/quant_kernels.py --sweep              # knob sweep first (its winners run the table)
  python bench/kernels/quant_kernels.py --sweep --ms 1 2 3 4  # GEMV only: word-stream vs fma knobs, then the table
  python bench/kernels/quant_kernels.py --compile-only --types Q4_K   # warm Triton's cache, no timing
  python bench/kernels/quant_kernels.py --smoke              # CPU interpreter, tiny shapes: checks the script
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from functools import partial
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

import bench_path  # noqa: E402,F401,I001  (bench/ on sys.path: common)
from common import RESULTS, device_name, median, print_table  # noqa: E402
from mlxr.ops.quant import core_triton as qt  # noqa: E402
from mlxr.ops.quant import wgemv_triton as wst  # noqa: E402
from mlxr.ops.quant.block_types import QUANT_TYPES, quant_type  # noqa: E402
from mlxr.ops.quant.reference import qmatmul_reference  # noqa: E402

TYPES = list(QUANT_TYPES)
MS = [1, 4, 16, 128, 512]
SHAPES = [(2048, 2048), (5632, 2048), (2048, 5632), (32000, 2048)]
GEMM_MS = [128, 512, 2048]  # the GEMM-path comparison
GEMM_TYPES = ["Q4_K", "Q8_0"]
GEMM_SHAPES = [(5632, 2048), (2048, 5632)]
ROTATE_BYTES = 128 << 20  # > 2 x the L2 of an H100 (50 MB) / H200 (60 MB)
REPS = 50
DT = torch.bfloat16


class Ctx:
    smoke = False
    compile_only = False
    device = "cuda"


def random_raw(qtype: str, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Random valid blocks: random bytes, fp16 scales of either sign in [1e-3, 1e-2]."""
    t = quant_type(qtype)
    nb = k // t.block_elems
    raw = torch.randint(0, 256, (n, nb, t.block_bytes), dtype=torch.uint8, device=Ctx.device, generator=gen)
    d_at = 208 if qtype == "Q6_K" else 0
    for at in ([d_at, 2] if qtype in ("Q4_K", "Q5_K") else [d_at]):
        d = torch.rand(n, nb, device=Ctx.device, generator=gen) * 9e-3 + 1e-3
        d = d * (torch.randint(0, 2, (n, nb), device=Ctx.device, generator=gen) * 2 - 1)
        raw[..., at:at + 2] = d.half().view(torch.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * t.block_bytes)


def time_ms(fns: list, reps: int = REPS) -> float:
    """Median ms per call of fns (one per weight copy), graph-replayed; compile-only: one call each."""
    for f in fns:
        f()
    if Ctx.compile_only:
        return float("nan")
    if Ctx.smoke:
        t0 = time.perf_counter()
        for f in fns:
            f()
        return (time.perf_counter() - t0) * 1e3 / len(fns)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        run = g.replay
    except Exception as e:  # noqa: BLE001
        print(f"  (no graph: {type(e).__name__}: {e})"[:200])

        def run() -> None:
            for f in fns:
                f()
    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(fns))
    return median(times)


def copies(nbytes: int, cap: int = 64) -> int:
    return 1 if Ctx.smoke else max(1, min(cap, math.ceil(ROTATE_BYTES / nbytes)))


def weights(qtype: str, n: int, k: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator(device=Ctx.device).manual_seed(seed)
    one = random_raw(qtype, n, k, gen)
    return [one] + [random_raw(qtype, n, k, gen) for _ in range(copies(one.numel()) - 1)]


def ceilings() -> dict:
    if Ctx.smoke or Ctx.compile_only:
        return {"copy_GBps": float("nan"), "matmul_bf16_TFLOPs": float("nan")}
    n = 1 << 29
    src, dst = torch.randn(n, device="cuda", dtype=DT), torch.empty(n, device="cuda", dtype=DT)
    copy_ms = triton.testing.do_bench(partial(dst.copy_, src), warmup=10, rep=60, return_mode="median")
    src = dst = None
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=DT) for _ in range(2))
    mm_ms = triton.testing.do_bench(partial(torch.matmul, a, b), warmup=10, rep=60, return_mode="median")
    return {"copy_GBps": 2 * 2 * n / copy_ms / 1e6, "matmul_bf16_TFLOPs": 2 * 8192**3 / mm_ms / 1e9}


def report(row: dict) -> dict:
    print("  " + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                           if v not in (None, "")), flush=True)
    return row


# ---- the launch-knob sweep ------------------------------------------------------------------

GEMV_TILES = [(16, 4, 4), (16, 8, 8), (32, 4, 8), (32, 4, 4), (64, 4, 8), (64, 4, 4)]
WS_TILES = [(1, 1), (2, 1), (4, 1), (8, 1)]  # the word-stream kernel's (output channels per program, num_warps)
PER_SM = [4, 8]
GEMV16_TILES = [(64, 4, 4), (32, 4, 4), (128, 4, 8)]
DEQUANT_TILES = [(32, 4, 8), (16, 4, 4), (64, 4, 8), (32, 4, 4)]
GEMM_TILES = [(128, 128, 2, 8, 3), (128, 128, 4, 8, 3), (128, 128, 2, 8, 4), (128, 64, 2, 4, 3), (64, 64, 4, 4, 3)]
SWEEP_SHAPES = [(5632, 2048), (2048, 5632), (32000, 2048)]


def sweep(types: list[str], seconds: float) -> tuple[list[dict], dict]:
    rows, best = [], {}
    shapes = [(64, 512)] if Ctx.smoke else SWEEP_SHAPES
    per_type = seconds / len(types)
    for qtype in types:
        t_type = time.time()

        def until(frac: float, t_type: float = t_type) -> float:  # this type's share, split between the parts
            return t_type + per_type * frac
        ws = {s: weights(qtype, *s) for s in shapes}
        x1 = {s: torch.randn(1, s[1], device=Ctx.device, dtype=DT) for s in shapes}
        refs = {s: qmatmul_reference(x1[s], ws[s][0], qtype, s[1]).float() for s in shapes}
        gemv_knobs = [(tile, per_sm) for tile in GEMV_TILES for per_sm in PER_SM]
        score = gemv_sweep(qtype, ws, x1, refs, "fma", gemv_knobs, until(0.35), rows)
        if score and not Ctx.compile_only:
            (tile, per_sm) = min(score, key=score.get)
            best.setdefault("gemv", {})[qtype] = [list(tile), per_sm]
        ws_knobs = [(tile, per_sm) for tile in WS_TILES for per_sm in PER_SM]
        score = gemv_sweep(qtype, ws, x1, refs, "ws", ws_knobs, until(0.5), rows)
        if score and not Ctx.compile_only:
            (tile, per_sm) = min(score, key=score.get)
            best.setdefault("ws", {})[qtype] = [list(tile), per_sm]
        # 16 rows on the tensor cores; and 2..8 rows: CUDA cores or tensor cores
        s = shapes[0]
        score = {}
        x16 = torch.randn(16, s[1], device=Ctx.device, dtype=DT)
        for tile in GEMV16_TILES:
            if time.time() > until(0.65):
                break
            cfg = {"kind": "dot", "bn": tile[0], "u": tile[1], "warps": tile[2]}
            ms = time_ms([partial(qt.qgemv_triton, x16, r, qtype, s[1], config=cfg) for r in ws[s]], 20)
            score[tile] = ms
            rows.append(report({"sweep": "gemv M=16", "type": qtype, "shape": f"{s[0]}x{s[1]}", "cfg": str(cfg),
                                "us": 1e3 * ms, "GB/s": ws[s][0].numel() / ms / 1e6}))
        if score and not Ctx.compile_only:
            best.setdefault("gemv16", {})[qtype] = list(min(score, key=score.get))
        for m in (2, 3, 4, 8):
            for kind in ("ws", "fma", "dot"):
                if (kind != "dot" and m > qt.FMA_MAX_M) or time.time() > until(0.8):
                    continue
                xm = torch.randn(m, s[1], device=Ctx.device, dtype=DT)
                ms = time_ms([partial(qt.qgemv_triton, xm, r, qtype, s[1], config={"kind": kind}) for r in ws[s]], 20)
                rows.append(report({"sweep": f"gemv M={m}", "type": qtype, "shape": f"{s[0]}x{s[1]}", "cfg": kind,
                                    "us": 1e3 * ms, "GB/s": ws[s][0].numel() / ms / 1e6}))
        del ws
        # dequantize_triton's tiles (the GEMM path's first half), bf16 out
        s = shapes[-1]
        w1 = weights(qtype, *s)[:2]
        score = {}
        want = qt.dequantize_triton(w1[0], qtype, s[1], DT, config={"bn": 32, "u": 4, "warps": 8})
        for tile in DEQUANT_TILES:
            if time.time() > until(1.0):
                break
            cfg = dict(zip(("bn", "u", "warps"), tile))
            ms = time_ms([partial(qt.dequantize_triton, r, qtype, s[1], DT, config=cfg) for r in w1], 20)
            same = bool(torch.equal(qt.dequantize_triton(w1[0], qtype, s[1], DT, config=cfg), want))
            if same:
                score[tile] = ms
            nbytes = w1[0].numel() + 2 * s[0] * s[1]
            rows.append(report({"sweep": "dequant bf16", "type": qtype, "shape": f"{s[0]}x{s[1]}", "cfg": str(cfg),
                                "us": 1e3 * ms, "GB/s": nbytes / ms / 1e6, "same": same}))
        if score and not Ctx.compile_only:
            best.setdefault("dequant", {})[qtype] = list(min(score, key=score.get))
    return rows, best


def gemv_sweep(qtype: str, ws: dict, x1: dict, refs: dict, kind: str, knobs: list, deadline: float,
               rows: list[dict]) -> dict:
    """Time one row of x through qgemv_triton's `kind` kernel for each (tile, per_sm) in knobs, over
    the shapes of ws, until deadline: {knob: total ms} for the knobs whose results match refs."""
    score = {}
    for tile, per_sm in knobs:
        if time.time() > deadline:
            break
        if kind == "ws":
            cfg = {"kind": kind, "bn": tile[0], "warps": tile[1], "per_sm": per_sm}
        else:
            cfg = {"kind": kind, "bn": tile[0], "u": tile[1], "warps": tile[2], "per_sm": per_sm}
        tot, ok = 0.0, True
        for s in ws:
            ms = time_ms([partial(qt.qgemv_triton, x1[s], r, qtype, s[1], config=cfg) for r in ws[s]], 20)
            got = qt.qgemv_triton(x1[s], ws[s][0], qtype, s[1], config=cfg).float()
            err = ((got - refs[s]).abs().max() / refs[s].abs().max().clamp_min(1e-30)).item()
            ok = ok and err < 2e-2
            tot += ms
            rows.append(report({"sweep": "gemv M=1", "type": qtype, "shape": f"{s[0]}x{s[1]}", "cfg": str(cfg),
                                "us": 1e3 * ms, "GB/s": ws[s][0].numel() / ms / 1e6, "max_rel_err": err}))
        if ok:
            score[(tuple(tile), per_sm)] = tot
    return score


def apply_best(best: dict) -> None:
    """Run the table with the sweep's winners (print them as the module tables' literals)."""
    for qtype, (tile, per_sm) in best.get("gemv", {}).items():
        qt._GEMV[qtype] = tuple(tile)
        qt._PROGRAMS_PER_SM[qtype] = per_sm
    for qtype, (tile, per_sm) in best.get("ws", {}).items():
        wst._WGEMV[qtype][1] = tuple(tile)
        wst._WGEMV_PER_SM[qtype] = per_sm
    for qtype, tile in best.get("gemv16", {}).items():
        qt._GEMV16[qtype] = tuple(tile)
    for qtype, tile in best.get("gemm", {}).items():
        qt._GEMM[qtype] = tuple(tile)
    print("sweep winners:")
    print("dequant (per type; the module keeps one):", best.get("dequant"))
    print("_GEMV =", {q: tuple(v) for q, v in qt._GEMV.items()})
    print("_PROGRAMS_PER_SM =", dict(qt._PROGRAMS_PER_SM))
    print("_WGEMV (one row of x) =", {q: v[1] for q, v in wst._WGEMV.items()})
    print("_WGEMV_PER_SM =", dict(wst._WGEMV_PER_SM))
    print("_GEMV16 =", {q: tuple(v) for q, v in qt._GEMV16.items()})
    print("_GEMM =", {q: tuple(v) for q, v in qt._GEMM.items()})


# ---- the table ------------------------------------------------------------------------------


def table(types: list[str], ms_list: list[int], shapes: list[tuple[int, int]]) -> list[dict]:
    rows, base = [], {}
    for n, k in shapes:
        for qtype in types:
            ws = weights(qtype, n, k)
            wbytes = ws[0].numel()
            for m in ms_list:
                x = torch.randn(m, k, device=Ctx.device, dtype=DT)
                ms = time_ms([partial(qt.qmatmul_triton, x, r, qtype, k) for r in ws])
                row = {"type": qtype, "M": m, "N": n, "K": k, "us": 1e3 * ms, "GB/s": wbytes / ms / 1e6}
                if m > 16:
                    row["TFLOP/s"] = 2 * m * n * k / ms / 1e9
                    row["path"] = "dequant+matmul" if m >= qt.GEMM_DEQUANT_MIN_M else "fused"
                elif m <= qt.FMA_MAX_M and wst.wgemv_fits(ws[0], qtype, m):
                    row["path"] = "ws"
                else:
                    row["path"] = "fma" if m <= qt._FMA_ROWS[qtype] else "dot16"
                if (n, k, m) not in base:
                    base[(n, k, m)] = bf16_ms(n, k, m, x)
                bms = base[(n, k, m)]
                row.update({"bf16_us": 1e3 * bms, "bf16_GB/s": 2 * n * k / bms / 1e6, "speedup": bms / ms})
                if m > 16:
                    row["bf16_TFLOP/s"] = 2 * m * n * k / bms / 1e9
                rows.append(report(row))
            del ws
    return rows


def bf16_ms(n: int, k: int, m: int, x: torch.Tensor) -> float:
    """torch.matmul on dequantized bf16 weights (as many copies as fit the rotation)."""
    ws = [torch.randn(n, k, device=Ctx.device, dtype=DT) * 0.01 for _ in range(copies(2 * n * k, 16))]
    return time_ms([partial(torch.matmul, x, w.T) for w in ws])


def gemm_paths(types: list[str]) -> list[dict]:
    rows = []
    shapes, ms_list = (GEMM_SHAPES, GEMM_MS) if not Ctx.smoke else ([(64, 512)], [20, 40])
    for n, k in shapes:
        for qtype in [t for t in GEMM_TYPES if t in types]:
            ws = weights(qtype, n, k)[:4]
            for m in ms_list:
                x = torch.randn(m, k, device=Ctx.device, dtype=DT)
                fused = time_ms([partial(qt.qmatmul_fused_triton, x, r, qtype, k) for r in ws])
                deq = time_ms([partial(qt.qmatmul_dequant_triton, x, r, qtype, k) for r in ws])
                fl = 2 * m * n * k
                rows.append(report({"type": qtype, "M": m, "N": n, "K": k, "fused_us": 1e3 * fused,
                                    "dequant_us": 1e3 * deq, "fused_TFLOP/s": fl / fused / 1e9,
                                    "dequant_TFLOP/s": fl / deq / 1e9,
                                    "faster": "fused" if fused < deq else "dequant+matmul"}))
    return rows


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--types", nargs="*", default=TYPES)
    p.add_argument("--ms", nargs="*", type=int, default=None, help="rows of x in the table (default: %s)" % MS)
    p.add_argument("--sweep", action="store_true", help="time launch knobs first and run the table with the best")
    p.add_argument("--sweep-seconds", type=float, default=150.0, help="stop sweeping after this long")
    p.add_argument("--compile-only", action="store_true", help="compile every kernel the run would time, no timing")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args()
    Ctx.smoke, Ctx.compile_only = args.smoke, args.compile_only
    Ctx.device = "cpu" if args.smoke else "cuda"
    torch.manual_seed(0)
    t0 = time.time()
    dev = "interpreter" if args.smoke else device_name("cuda")
    ceil = ceilings()
    print(f"{dev}: copy {ceil['copy_GBps']:,.0f} GB/s, bf16 matmul {ceil['matmul_bf16_TFLOPs']:,.0f} TFLOP/s",
          flush=True)
    name = f"quant_kernels_{slug(dev)}.json"
    paths = ([] if args.smoke else [RESULTS / name]) + ([Path(args.out) / name] if args.out else [])
    payload = {"device": dev, "torch": torch.__version__, "triton": triton.__version__, "x_dtype": "bfloat16",
               "ceilings": ceil}

    def save() -> None:  # after every phase: a run cut short keeps what it measured
        if args.compile_only:
            return
        payload["tables"] = {"_GEMV": qt._GEMV, "_PROGRAMS_PER_SM": qt._PROGRAMS_PER_SM, "_GEMV16": qt._GEMV16,
                             "_WGEMV": wst._WGEMV, "_WGEMV_PER_SM": wst._WGEMV_PER_SM,
                             "_GEMM": qt._GEMM, "_FMA_ROWS": qt._FMA_ROWS, "_DEQUANT": qt._DEQUANT,
                             "GEMM_DEQUANT_MIN_M": qt.GEMM_DEQUANT_MIN_M}
        payload["seconds"] = time.time() - t0
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(payload, indent=1, default=str) + "\n")

    if args.sweep:
        payload["sweep"], payload["sweep_best"] = sweep(args.types, args.sweep_seconds)
        if not args.compile_only:
            apply_best(payload["sweep_best"])
        save()
    ms_list, shapes = (MS, SHAPES) if not args.smoke else ([1, 4, 16, 20], [(64, 512)])
    ms_list = args.ms or ms_list
    payload["rows"] = rows = table(args.types, ms_list, shapes)
    save()
    payload["gemm_paths"] = gemm = gemm_paths(args.types) if max(ms_list) > 16 else []
    save()
    if args.compile_only:
        print(f"compiled in {time.time() - t0:.0f} s")
        return
    if gemm:
        print("\nGEMM paths (bf16 x):")
        print_table(gemm, ["type", "M", "N", "K", "fused_us", "dequant_us", "fused_TFLOP/s", "dequant_TFLOP/s",
                           "faster"])
    print("\nqmatmul_triton (bf16 x) vs torch.matmul on the bf16 weight:")
    print_table(rows, ["type", "M", "N", "K", "path", "us", "GB/s", "TFLOP/s", "bf16_us", "bf16_TFLOP/s", "speedup"])
    print(f"wrote {', '.join(map(str, paths))} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
