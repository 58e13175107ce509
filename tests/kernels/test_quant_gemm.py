"""The fused GGUF GEMM with split-K (core_triton.qmatmul_fused_triton) against gguf-py's
dequantization and a float64 matmul, on the CPU interpreter (tiny shapes) and the GPU (`gpu`,
real shapes); and the dispatcher's reading of the measured table (gemm_triton.py)."""
from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from test_quant_kernels import DEVICES, gguf_dequantize, make_raw, rand_x  # noqa: E402

from mlxr.ops.quant import gemm_triton as gt  # noqa: E402
from mlxr.ops.quant.core_triton import qmatmul_fused_triton, qmatmul_triton  # noqa: E402

TYPES = ["Q4_K", "Q8_0", "Q6_K", "Q5_K", "Q4_0"]
# Relative to the largest |output|: the weight and x rounded to bf16 (fp16), float32 sums.
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 4e-3}


def _reference(x: torch.Tensor, raw_np, qtype: str) -> torch.Tensor:
    w = gguf_dequantize(raw_np, qtype).double()
    return x.cpu().double() @ w.T


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype and not out.isnan().any(), "unwritten (NaN) output"
    err = ((out.cpu().double() - ref).abs().max() / ref.abs().max()).item()
    assert err < TOL[dtype], err


def _cases(device: str) -> dict[tuple[int, int], list[tuple[int, dict]]]:
    """(n, k) -> [(m, config)]: one row tile and several, with and without split-K."""
    if device == "cpu":
        return {(40, 512): [(20, {"bm": 32, "bn": 32, "u": 2, "per_sm": 0}),
                            (37, {"bm": 16, "bn": 16, "u": 2, "split": 3})]}
    cfgs = ({"bm": 64, "bn": 64, "u": 2, "per_sm": 2}, {"bm": 128, "bn": 128, "u": 2, "warps": 8, "per_sm": 0})
    return {shape: [(m, c) for m in (17, 64, 200) for c in cfgs] for shape in ((1024, 4096), (512, 14336))}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", TYPES)
def test_fused_gemm_matches_gguf_py(device, qtype):
    dtype = torch.bfloat16 if device == "cuda" or qtype != "Q4_0" else torch.float16
    for i, ((n, k), runs) in enumerate(_cases(device).items()):
        raw_np = make_raw(qtype, n, k, seed=i)
        raw = torch.from_numpy(raw_np).to(device)
        for m, cfg in runs:
            x = rand_x(m, k, dtype, device, seed=m + i)
            out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
            qmatmul_fused_triton(x, raw, qtype, k, out=out, config=cfg)
            _check(out, _reference(x, raw_np, qtype), dtype)
            if cfg.get("split") or cfg.get("per_sm"):  # the split-K counters were reset: a second call agrees
                again = qmatmul_fused_triton(x, raw, qtype, k, config=cfg)
                assert torch.equal(again, out)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K"])
def test_dispatcher_rows_match_gguf_py_on_the_gpu(qtype):
    """qmatmul_triton's own choice (the committed table's) at decode and prefill row counts."""
    n, k = 1024, 4096
    raw_np = make_raw(qtype, n, k, seed=3)
    raw = torch.from_numpy(raw_np).cuda()
    for m in (24, 64, 100, 256, 700):
        x = rand_x(m, k, torch.bfloat16, "cuda", seed=m)
        _check(qmatmul_triton(x, raw, qtype, k), _reference(x, raw_np, qtype), torch.bfloat16)


def _table(entries: dict, capability=None) -> dict:
    return {"capability": capability, "types": entries}


def test_choose_reads_buckets_and_nearest_shapes():
    fused = {"bm": 64, "bn": 64, "u": 2, "warps": 4, "stages": 2, "per_sm": 2}
    rows = [{"n": 4096, "k": 4096, "m": 64, "path": "fused", "config": fused},
            {"n": 4096, "k": 4096, "m": 512, "path": "dequant", "config": None},
            {"n": 32000, "k": 4096, "m": 64, "path": "dequant", "config": None}]
    table = _table({"Q4_K": rows})
    x = torch.zeros(1, dtype=torch.bfloat16)
    assert gt.choose("Q4_K", 40, 6144, 4096, x, table) == fused  # bucket 64, nearest shape 4096x4096
    assert gt.choose("Q4_K", 64, 30000, 4096, x, table) is None  # nearest is the lm_head's: dequant
    assert gt.choose("Q4_K", 65, 4096, 4096, x, table) is None  # bucket 512 measured dequant
    assert gt.choose("Q4_K", 513, 4096, 4096, x, table) is None  # past the largest bucket
    assert gt.choose("Q8_0", 40, 4096, 4096, x, table) is None  # a type the table lacks
    assert gt.choose("Q4_K", 40, 4096, 4096, x.float(), table) is None  # float32 x: cuBLAS in float32


def test_committed_table_is_well_formed():
    table = gt.load_table()
    if not table:
        pytest.skip("no table committed")
    assert table["measured_by"] == "bench/kernels/quant_gemm_table.py" and table["capability"]
    for qtype, rows in table["types"].items():
        assert rows, qtype
        for r in rows:
            assert r["path"] in ("fused", "repacked", "dequant"), r
            assert (r["config"] is None) == (r["path"] == "dequant"), r
            assert r["best_us"] <= r["dequant_us"] * 1.0001, r  # the winner is the faster one
    json.dumps(table)


def test_the_table_can_be_switched_off(monkeypatch):
    """MLXR_QUANT_GEMM_TABLE=none: no table, so every product past 16 rows dequantizes (A/B runs)."""
    gt.load_table.cache_clear()
    monkeypatch.setenv("MLXR_QUANT_GEMM_TABLE", "none")
    try:
        assert gt.load_table() == {}
    finally:
        gt.load_table.cache_clear()
