"""The repacked GGUF GEMM (ops/quant/repack.py + repacked_triton.py): the layout against gguf-py's
dequantization bit for bit, and the kernel against a float64 matmul of that dequantization, on the
CPU interpreter (tiny shapes) and the GPU (`gpu`, the 8B shape's projections)."""
from __future__ import annotations

import pytest
import torch

import triton_grid  # noqa: F401  (TRITON_INTERPRET before any kernel module)
from quant_blocks import random_blocks
from test_quant_kernels import DEVICES, gguf_dequantize, rand_x

from mlxr.ops.quant.repack import REPACK_TYPES, can_repack, dequantize_repacked, repack
from mlxr.ops.quant.repacked_triton import repacked_matmul

# Relative to the largest |output|: x is rounded (to bf16 / fp16) and the output once (with fold 0
# the dequantized weights too, as dequantize + cuBLAS rounds them).
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("qtype", REPACK_TYPES)
def test_layout_holds_gguf_py_weights_exactly(qtype):
    raw_np = random_blocks(qtype, 8, 512, seed=3)
    w = repack(torch.from_numpy(raw_np), qtype, 512)
    assert torch.equal(dequantize_repacked(w), gguf_dequantize(raw_np, qtype).float())
    assert w.q.shape == ((256, 8) if w.bits == 4 else (512, 8)) and w.scales.shape == (512 // w.group, 8)


def test_widths_that_the_layout_cannot_hold_are_refused():
    assert not can_repack("Q4_K", 32 * 3) and not can_repack("IQ4_NL", 256)
    with pytest.raises(ValueError, match="no repacked layout"):
        repack(torch.zeros(2, 18 * 3, dtype=torch.uint8), "Q4_0", 96)


def _cases(device):
    if device == "cpu":  # rows on and off the tile, channels off the tile, split-K with a short last split
        return [((40, 256), 20, {"bm": 16, "bn": 32, "bk": 64}),
                ((24, 768), 33, {"bm": 32, "bn": 16, "bk": 128, "split": 4}),
                ((24, 768), 33, {"bm": 32, "bn": 16, "bk": 128, "split": 3, "fold": 0})]  # dequantized in registers
    return [((n, k), m, cfg) for n, k in ((28672, 4096), (4096, 14336), (1024, 4096)) for m in (17, 64, 200)
            for cfg in ({"bm": 64, "bn": 128, "bk": 128}, {"bm": 64, "bn": 64, "bk": 128, "split": 4},
                        {"bm": 64, "bn": 256, "bk": 128, "warps": 8, "fold": 0})]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", REPACK_TYPES)
def test_repacked_gemm_matches_gguf_py(device, qtype):
    for i, ((n, k), m, cfg) in enumerate(_cases(device)):
        raw_np = random_blocks(qtype, n, k, seed=i)
        w = repack(torch.from_numpy(raw_np).to(device), qtype, k)
        weight = gguf_dequantize(raw_np, qtype).double()
        for dtype in (torch.bfloat16, torch.float16):
            x = rand_x(m, k, dtype, device, seed=m + i)
            out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
            repacked_matmul(x, w, cfg, out=out)
            assert not out.isnan().any(), "unwritten output"
            ref = x.cpu().double() @ weight.T
            err = ((out.cpu().double() - ref).abs().max() / ref.abs().max()).item()
            assert err < TOL[dtype], (qtype, n, k, m, cfg, dtype, err)
            assert torch.equal(repacked_matmul(x, w, cfg), out)  # the returned tensor, no out=


def test_the_table_decides_where_the_repacked_gemm_runs_and_what_is_repacked():
    from mlxr.ops.quant import gemm_triton as gt

    rep = {"bm": 64, "bn": 128, "bk": 128, "split": 1}
    cell = {"n": 28672, "k": 4096, "us": 1.0}
    table = {"capability": [9, 0], "types": {"Q4_K": [
        {**cell, "m": 64, "path": "repacked", "config": rep},
        {**cell, "m": 512, "path": "dequant", "config": None},
        {"n": 4096, "k": 4096, "m": 64, "path": "fused", "config": {"bm": 64}},
        {"n": 4096, "k": 4096, "m": 512, "path": "dequant", "config": None}]}}
    assert gt.repacked_config(table, "Q4_K", 40, 28672, 4096, [9, 0]) == rep
    assert gt.repacked_config(table, "Q4_K", 100, 28672, 4096, [9, 0]) is None  # bucket 512: dequant
    assert gt.repacked_config(table, "Q4_K", 40, 4096, 4096, [9, 0]) is None  # nearest shape: fused
    assert gt.repacked_config(table, "Q4_K", 40, 28672, 4096, [8, 0]) is None  # another device kind
    assert gt.repack_wins(table, "Q4_K", 28672, 4096, [9, 0]) and gt.repack_wins(table, "Q4_K", 14336 * 2, 4096, [9, 0])
    assert not gt.repack_wins(table, "Q4_K", 4096, 4096, [9, 0]) and not gt.repack_wins(table, "Q6_K", 28672, 4096, [9, 0])
    assert gt._choose(table, "Q4_K", 40, 28672, 4096, [9, 0]) is None  # the fused path is not taken there
