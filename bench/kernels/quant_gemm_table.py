"""Measures the table mlxr/ops/quant/gemm_triton.py dispatches from: for each GGUF type, weight
shape (the TinyLlama and Llama-3-8B shapes' projections) and row bucket, dequantize + cuBLAS
beside the fused tensor-core GEMM and the repacked GEMM (ops/quant/repack.py) at a few launches, each result checked against the former.
Writes the winners to mlxr/ops/quant/gemm_table.json (or --table) and every time to
bench/results/<day>/quant_gemm_table-*.json; prints a table last.

Times: triton.testing.do_bench medians (CUDA events) over enough copies of the weight, cycled,
that consecutive calls read more than the L2 (the weights come from HBM, as in a model).
bf16 x from a normal draw; weight bytes random with fp16 scales in a sane range.

  python bench/kernels/quant_gemm_table.py                     # Q4_K Q8_0 Q6_K, every shape
  python bench/kernels/quant_gemm_table.py --types Q4_K --rows 64
  python bench/kernels/quant_gemm_table.py --types Q4_K Q6_K --models llama3-8b --merge   # the rest kept
  python bench/kernels/quant_gemm_table.py --smoke             # CPU interpreter, tiny: checks the script
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import bench_path  # noqa: E402,F401,I001  (bench/ on sys.path: common)
from common import device_name, print_table, write_result  # noqa: E402
from mlxr.ops.quant import gemm_triton as gt  # noqa: E402
from mlxr.ops.quant.block_types import quant_type  # noqa: E402
from mlxr.ops.quant.core_triton import qmatmul_dequant_triton, qmatmul_fused_triton  # noqa: E402
from mlxr.ops.quant.repack import REPACK_TYPES, repack  # noqa: E402
from mlxr.ops.quant.repacked_triton import repacked_matmul  # noqa: E402

# (N, K) of each projection: fused qkv, o, k or v alone, fused gate_up, down, lm_head.
SHAPES = {"llama3-8b": [(6144, 4096), (4096, 4096), (1024, 4096), (28672, 4096), (4096, 14336), (32000, 4096)],
          "tinyllama": [(2560, 2048), (2048, 2048), (256, 2048), (11264, 2048), (2048, 5632), (32000, 2048)]}
ROWS = [32, 64, 128, 256, 512]
L2_BYTES = 60 << 20
# How much faster than dequantize + cuBLAS a fused launch must be to be chosen (--margin): 0 for
# the committed table (what the 2026-12-02 end-to-end figures ran with); a margin would drop
# near-ties, each one more kernel variant to compile at a first start.
MARGIN = 0.0
REPACKED = "repacked:"  # the times' key prefix of a repacked-GEMM launch


def candidates(rows: int) -> list[dict]:
    """Fused launches tried at a bucket: one row tile up to 128 rows, two output-channel widths,
    split-K on and off."""
    bm = min(128, max(16, 1 << (rows - 1).bit_length()))
    out = []
    for bn, per_sm in itertools.product((64, 128), (0, 2)):
        out.append({"bm": bm, "bn": bn, "u": 2, "warps": 4 if bn == 64 else 8, "stages": 2, "per_sm": per_sm})
    return out


def repacked_candidates(rows: int, n: int, k: int, sms: int = 132) -> list[dict]:
    """Repacked-GEMM launches tried at a bucket: folded and in-register dequantization, two
    output-channel widths, two warp/stage pairs, K unsplit and split to give every SM about two
    programs."""
    bm = min(128, max(16, 1 << (rows - 1).bit_length()))
    out = []
    # In-register dequantization keeps no float32 group product beside the accumulator: wider tiles.
    widths = [(1, bn) for bn in (64, 128)] + [(0, bn) for bn in (128, 256)]
    for (fold, bn), (warps, stages) in itertools.product(widths, ((4, 3), (8, 4))):
        tiles = -(-n // bn) * -(-rows // bm)
        for split in sorted({1, max(1, min(k // 128, -(-2 * sms // tiles)))}):
            out.append({"bm": bm, "bn": bn, "bk": 128, "split": split, "warps": warps, "stages": stages, "fold": fold})
    return out


def random_raw(qtype: str, n: int, k: int, device: str, seed: int) -> torch.Tensor:
    t = quant_type(qtype)
    g = torch.Generator(device=device).manual_seed(seed)
    raw = torch.randint(0, 256, (n, k // t.block_elems, t.block_bytes), dtype=torch.uint8, device=device, generator=g)
    d = (torch.rand(n, k // t.block_elems, device=device, generator=g) * 0.01 + 1e-3).half().view(torch.uint8)
    at = 208 if qtype == "Q6_K" else 0
    raw[..., at:at + 2] = d.view(n, -1, 2)
    if qtype in ("Q4_K", "Q5_K"):
        raw[..., 2:4] = d.view(n, -1, 2)
    return raw.view(n, -1).contiguous()


def timer(fn, raws, x, qtype, k, smoke: bool):
    """Median microseconds of fn over the copies of the weight, cycled."""
    if smoke:
        fn(x, raws[0], qtype, k)
        return float("nan")
    import triton.testing

    it = itertools.cycle(raws)
    out = torch.empty(x.shape[0], raws[0].shape[0], dtype=x.dtype, device=x.device)
    return 1e3 * triton.testing.do_bench(lambda: fn(x, next(it), qtype, k, out=out), warmup=5, rep=25,
                                         return_mode="median")


def measure(qtype: str, n: int, k: int, rows: list[int], device: str, smoke: bool, margin: float) -> list[dict]:
    one = random_raw(qtype, n, k, device, 0)
    copies = 1 if smoke else max(1, min(16, -(-2 * L2_BYTES // one.numel())))
    raws = [one] + [random_raw(qtype, n, k, device, s) for s in range(1, copies)]
    found = []
    for m in rows:
        x = torch.randn(m, k, device=device).to(torch.bfloat16)
        ref = qmatmul_dequant_triton(x, one, qtype, k).float()
        scale = ref.abs().max().item() or 1.0
        times = {"dequant": timer(qmatmul_dequant_triton, raws, x, qtype, k, smoke)}
        for cfg in candidates(m):
            got = qmatmul_fused_triton(x, one, qtype, k, config=cfg).float()
            err = ((got - ref).abs().max() / scale).item()
            if not err < 3e-2:  # NaN fails too
                raise AssertionError(f"{qtype} {n}x{k} m={m} {cfg}: max error {err:.3g} of the largest output")
            us = timer(lambda *a, cfg=cfg, **kw: qmatmul_fused_triton(*a, config=cfg, **kw), raws, x, qtype, k, smoke)
            times[json.dumps(cfg, sort_keys=True)] = us
        if qtype in REPACK_TYPES and k % 64 == 0:
            times.update(_time_repacked(x, raws, qtype, n, k, m, ref, scale, smoke))
        found.append(decide({"type": qtype, "n": n, "k": k, "m": m, "dequant_us": times["dequant"],
                             "weight_bytes": one.numel(), "times_us": times}, smoke, margin))
    return found


def _time_repacked(x, raws, qtype, n, k, m, ref, scale, smoke) -> dict:
    packed = [repack(r, qtype, k) for r in raws]
    times = {}
    for cfg in repacked_candidates(m, n, k):
        got = repacked_matmul(x, packed[0], cfg).float()
        err = ((got - ref).abs().max() / scale).item()
        if not err < 3e-2:
            raise AssertionError(f"{qtype} {n}x{k} m={m} repacked {cfg}: max error {err:.3g} of the largest output")
        if smoke:
            times[REPACKED + json.dumps(cfg, sort_keys=True)] = float("nan")
            continue
        import triton.testing

        it = itertools.cycle(packed)
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        times[REPACKED + json.dumps(cfg, sort_keys=True)] = 1e3 * triton.testing.do_bench(
            lambda cfg=cfg: repacked_matmul(x, next(it), cfg, out=out), warmup=5, rep=25, return_mode="median")
    return times


def decide(row: dict, smoke: bool = False, margin: float = MARGIN) -> dict:
    """The row's winner: the fastest fused launch where it beats dequantize + cuBLAS by `margin`
    (past the spread of repeated timings, and each fused launch is one more kernel variant to
    compile at start-up), else dequantize + cuBLAS."""
    fused = {c: us for c, us in row["times_us"].items() if c != "dequant"}
    cfg, us = min(fused.items(), key=lambda kv: kv[1] if kv[1] == kv[1] else 0.0) if fused else (None, float("inf"))
    take = smoke or us < row["dequant_us"] * (1 - margin)
    best_us = us if take else row["dequant_us"]
    path = ("repacked" if cfg.startswith(REPACKED) else "fused") if take else "dequant"
    cfg = cfg.removeprefix(REPACKED) if take else None
    return {**row, "path": path, "config": json.loads(cfg) if take else None,
            "best_us": best_us, "weight_gb_s": row["weight_bytes"] / best_us / 1e3 if best_us == best_us else None}


def _row_bytes(r: dict) -> int:
    """A weight's bytes from an earlier run's row (which gave its GB/s of the winner)."""
    return round(r["weight_gb_s"] * r["best_us"] * 1e3)


CELL_KEYS = ("n", "k", "m", "path", "config", "best_us", "dequant_us")


def _kept_table(path: str) -> dict | None:
    """--merge: the table already at path, whose cells this run does not measure are kept (only
    where it was measured on this device kind, with this Triton)."""
    if not Path(path).exists():
        return None
    old = json.loads(Path(path).read_text())
    here = list(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
    same = old.get("capability") == here and old.get("triton") == __import__("triton").__version__
    return old if same else None


def _table(rows_all: list[dict], a, where: dict | None, device: str, kept: dict | None) -> dict:
    types = {t: [{k: r[k] for k in CELL_KEYS} for r in rows_all if r["type"] == t] for t in a.types}
    for t, cells in (kept or {}).get("types", {}).items():
        new = {(c["n"], c["k"], c["m"]) for c in types.get(t, [])}
        types[t] = sorted([c for c in cells if (c["n"], c["k"], c["m"]) not in new] + types.get(t, []),
                          key=lambda c: (c["n"], c["k"], c["m"]))
    return {"device": where["device"] if where else device_name(device), "measured_by": "bench/kernels/quant_gemm_table.py",
            "capability": where["capability"] if where else
            (list(torch.cuda.get_device_capability()) if device == "cuda" else None),
            "triton": where["triton"] if where else __import__("triton").__version__,
            "results": where["date"] if where else None, "margin": a.margin,
            "rows": sorted(set(a.rows) | set((kept or {}).get("rows", []))), "types": types}


def _write_table(path: str, table: dict) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--types", nargs="*", default=["Q4_K", "Q8_0", "Q6_K"])
    p.add_argument("--rows", nargs="*", type=int, default=ROWS)
    p.add_argument("--models", nargs="*", default=list(SHAPES))
    p.add_argument("--table", default=str(gt.TABLE_PATH), help="where the dispatcher's table is written")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, one tiny shape: checks the script")
    p.add_argument("--margin", type=float, default=MARGIN, help="fused must beat dequant by this fraction")
    p.add_argument("--merge", action="store_true",
                   help="keep the cells of the table already at --table that this run does not measure")
    p.add_argument("--from-results", metavar="JSON",
                   help="no timing: rebuild the table from an earlier run's results (this version's rule)")
    a = p.parse_args()
    device = "cpu" if a.smoke else "cuda"
    shapes = [(64, 256)] if a.smoke else sorted({s for m in a.models for s in SHAPES[m]})
    rows_all, where = [], None
    if a.from_results:
        where = json.loads(Path(a.from_results).read_text())
        rows_all = [decide({**r, "weight_bytes": r.get("weight_bytes") or _row_bytes(r)}, margin=a.margin)
                    for r in where["results"]]
        a.types = list(dict.fromkeys(r["type"] for r in rows_all))
        if "capability" not in where and Path(a.table).exists():  # runs before this key was recorded
            where = {**where, **{k: json.loads(Path(a.table).read_text())[k] for k in ("capability", "triton")}}
    kept = _kept_table(a.table) if a.merge else None
    for qtype in [] if a.from_results else a.types:
        for n, k in shapes:
            if k % quant_type(qtype).block_elems:
                continue
            rows_all += measure(qtype, n, k, [17] if a.smoke else a.rows, device, a.smoke, a.margin)
            if not a.smoke:  # after every shape: a run cut short still leaves what it measured
                _write_table(a.table, _table(rows_all, a, where, device, kept))
            print(f"{qtype} {n}x{k} done", flush=True)
    table = _table(rows_all, a, where, device, kept)
    if not a.smoke:
        _write_table(a.table, table)
    if a.from_results:
        print_table(rows_all, ["type", "n", "k", "m", "path", "best_us", "dequant_us", "weight_gb_s"])
        return
    path = write_result("quant_gemm_table", {"device": device_name(device), "smoke": a.smoke, "margin": a.margin,
                                             "capability": table["capability"], "triton": table["triton"],
                                             "results": rows_all})
    print_table(rows_all, ["type", "n", "k", "m", "path", "best_us", "dequant_us", "weight_gb_s"])
    print(path)


if __name__ == "__main__":
    main()
