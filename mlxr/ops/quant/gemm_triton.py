"""GGUF weights times x of more than 16 rows on the GPU: the measured choice between the fused
tensor-core GEMM with split-K (core_triton.qmatmul_fused_triton) and dequantize + cuBLAS.

The fused GEMM (core_triton._qdot_kernel) reads each weight byte once per tile of BM rows of x,
dequantizes the tile in registers and multiplies it on the tensor cores (float32 accumulation);
where the output channels give too few tiles to fill the GPU, K is split across programs
(blocks_triton._finish: deterministic, one launch). Dequantize + cuBLAS writes the whole bf16
weight and reads it back every call: at decode batch sizes that moves ~8x the bytes of the
GGUF weight, so the fused kernel wins there, and cuBLAS wins once the product is compute-bound.

Which one runs, and with which launch, is read from gemm_table.json beside this file: written by
bench/kernels/quant_gemm_table.py on the device named in it, per type, weight shape and row
bucket. A call takes the smallest measured bucket holding its rows and the measured shape
nearest its own; past the largest bucket, on another device kind, for types or x dtypes the
table lacks: dequantize + cuBLAS (the path measured before the table existed). The fused
kernel reads the file's blocks; a third path, the repacked GEMM (repack.py, repacked_triton.py),
reads a layout built once at load, for the weights whose type and shape the table measured it
fastest on (`wants_repack`), at the cost in memory repack.py states.
"""
from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path

import torch

TABLE_PATH = Path(__file__).with_name("gemm_table.json")


@functools.cache
def load_table(path: str | None = None) -> dict:
    """The measured table: MLXR_QUANT_GEMM_TABLE's file (`none`: no table, so dequantize + cuBLAS
    everywhere, for A/B runs), else the committed one; {} where there is none."""
    path = path or os.environ.get("MLXR_QUANT_GEMM_TABLE") or str(TABLE_PATH)
    if path == "none":
        return {}
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else {}


@functools.cache
def _capability(device: torch.device) -> list[int]:
    return list(torch.cuda.get_device_capability(device))


def choose(qtype: str, m: int, n: int, k: int, x: torch.Tensor, table: dict | None = None) -> dict | None:
    """The fused kernel's launch for this product, or None: dequantize + cuBLAS."""
    if x.dtype not in (torch.bfloat16, torch.float16):
        return None
    here = _capability(x.device) if x.device.type == "cuda" else None
    if table is None:
        return _choose_cached(qtype, m, n, k, None if here is None else tuple(here))
    return _choose(table, qtype, m, n, k, here)


@functools.lru_cache(maxsize=4096)
def _choose_cached(qtype: str, m: int, n: int, k: int, here: tuple | None) -> dict | None:
    return _choose(load_table(), qtype, m, n, k, None if here is None else list(here))


def choose_repacked(qtype: str, m: int, n: int, k: int, x: torch.Tensor, table: dict | None = None) -> dict | None:
    """The repacked GEMM's launch (repacked_triton.py) where the table measured it fastest."""
    if x.dtype not in (torch.bfloat16, torch.float16) or x.device.type != "cuda":
        return None
    return repacked_config(load_table() if table is None else table, qtype, m, n, k, _capability(x.device))


def repacked_config(t: dict, qtype: str, m: int, n: int, k: int, here: list | None) -> dict | None:
    entry = _entry(t, qtype, m, n, k, here)
    return entry["config"] if entry is not None and entry["path"] == "repacked" else None


def wants_repack(qtype: str, n: int, k: int, device: torch.device, table: dict | None = None) -> bool:
    """Whether a weight of this type and shape should be repacked at load: the table measured the
    repacked GEMM fastest at some row bucket for the nearest shape on this device kind."""
    if device.type != "cuda":
        return False
    return repack_wins(load_table() if table is None else table, qtype, n, k, _capability(device))


def repack_wins(t: dict, qtype: str, n: int, k: int, here: list | None) -> bool:
    buckets = sorted({e["m"] for e in t.get("types", {}).get(qtype, ())})
    return any((e := _entry(t, qtype, b, n, k, here)) is not None and e["path"] == "repacked" for b in buckets)


def _choose(t: dict, qtype: str, m: int, n: int, k: int, here: list | None) -> dict | None:
    entry = _entry(t, qtype, m, n, k, here)
    return entry["config"] if entry is not None and entry["path"] == "fused" else None


def _entry(t: dict, qtype: str, m: int, n: int, k: int, here: list | None) -> dict | None:
    """The measured cell for m rows: the smallest bucket holding them, the nearest shape."""
    entries = t.get("types", {}).get(qtype)
    if not entries or (here is not None and here != t.get("capability")):
        return None
    buckets = sorted({e["m"] for e in entries})
    bucket = next((b for b in buckets if b >= m), None)
    if bucket is None:
        return None
    rows = [e for e in entries if e["m"] == bucket]
    return min(rows, key=lambda e: abs(math.log(e["n"] / n)) + abs(math.log(e["k"] / k)))
