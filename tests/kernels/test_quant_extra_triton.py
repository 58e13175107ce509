"""The extra types' Triton kernels against gguf-py: on the CPU interpreter (tiny shapes) without
CUDA, and on the GPU (`gpu`) with it."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

from quant_blocks import random_blocks, reference_dequantize  # noqa: E402

from mlxr.ops.quant.block_types import EXTRA_TYPES  # noqa: E402
from mlxr.ops.quant.extra_triton import dequantize_extra_triton, qmatmul_extra_triton  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter")),
           pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", list(EXTRA_TYPES))
def test_triton_dequantize_and_matmul_against_gguf_py(qtype: str, device: str) -> None:
    n, k = (20, 512) if device == "cpu" else (300, 4096)
    raw = random_blocks(qtype, n, k, seed=4)
    want = reference_dequantize(raw, qtype, n, k)
    t = torch.from_numpy(raw).to(device)
    got = dequantize_extra_triton(t, qtype, k).cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    w64 = torch.from_numpy(want).double()
    for m in (1, 3, 17):  # the GEMV kernel, then dequantize + matmul
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        ref = x.double() @ w64.T
        out = qmatmul_extra_triton(x.to(device), t, qtype, k).cpu().double()
        assert (out - ref).norm() / ref.norm() < 1e-5, (qtype, m)
        if device == "cuda":
            half = qmatmul_extra_triton(x.to(device, torch.bfloat16), t, qtype, k).cpu().double()
            assert (half - ref).norm() / ref.norm() < 2e-2


def _gemv_shapes() -> list[tuple[str, int]]:
    """SmolLM2's K (576: q/k/v/o/gate/up; 1536: down) and a short 96, for each type whose block divides them."""
    return [(q, k) for q, t in EXTRA_TYPES.items() for k in (96, 576, 1536) if k % t.block_elems == 0]


# The default launch (split-K on these few channels: the interpreter stands in 4 multiprocessors)
# and one program along K.
SPLITS = (None, {"split": 1})


def _no_dequantize(*args, **kwargs):
    raise AssertionError("the GEMV path dequantized the whole weight")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype,k", _gemv_shapes())
def test_gemv_any_k_and_up_to_16_rows_against_gguf_py_without_dequantizing(qtype: str, k: int, device: str,
                                                                            monkeypatch) -> None:
    import mlxr.ops.quant.extra_triton as qet

    n = 12 if device == "cpu" else 1000  # not a multiple of the channel tile
    raw = random_blocks(qtype, n, k, seed=k)
    w64 = torch.from_numpy(reference_dequantize(raw, qtype, n, k)).double()
    t = torch.from_numpy(raw).to(device)
    monkeypatch.setattr(qet, "dequantize_extra_triton", _no_dequantize)
    for config in SPLITS:
        for m in (1, 3, 9, 16):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            ref = x.double() @ w64.T
            out = qmatmul_extra_triton(x.to(device), t, qtype, k, config=config).cpu().double()
            assert (out - ref).norm() / ref.norm() < 1e-5, (qtype, k, m, config)
    with pytest.raises(AssertionError, match="dequantized"):  # 17 rows do take the dequantize path
        qmatmul_extra_triton(torch.randn(17, k, device=device), t, qtype, k)


def _row_types() -> list[tuple[str, int]]:
    return [(q, 576 if 576 % t.block_elems == 0 else 512) for q, t in EXTRA_TYPES.items()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype,k", _row_types())
def test_gemv_row_is_bit_identical_whatever_the_batch(qtype: str, k: int, device: str) -> None:
    """Speculative decoding's greedy tokens must match plain decode's: a verify batch's row must
    come out bit-for-bit as the same row alone, whatever the batch size and its other rows."""
    n = 12 if device == "cpu" else 1000
    t = torch.from_numpy(random_blocks(qtype, n, k, seed=5)).to(device)
    dtypes = [torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]
    for dtype, config in itertools.product(dtypes, SPLITS):
        row = torch.randn(1, k, generator=torch.Generator().manual_seed(0)).to(device, dtype)
        alone = qmatmul_extra_triton(row, t, qtype, k, config=config)
        for m, at in ((2, 1), (5, 0), (9, 4), (16, 15)):
            batch = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).mul(1 + at).to(device, dtype)
            batch[at] = row[0]
            got = qmatmul_extra_triton(batch, t, qtype, k, config=config)[at:at + 1]
            diff = (got.float() - alone.float()).abs().max().item()
            assert torch.equal(got, alone), (qtype, dtype, config, m, at, diff)


# Compiles the GEMV for sm_90 (Triton's own ptxas; no GPU needed) at several row counts and
# prints, per row count, the layouts of the tensors its tl.sum reductions take.
_REDUCE_LAYOUTS = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mlxr.ops.quant import extra_triton as qet
from mlxr.ops.quant.block_types import EXTRA_TYPES

qtype, k, split, aligned_args = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
halves = len(sys.argv) > 6 and sys.argv[6] == "1"
mbs = [int(v) for v in sys.argv[5].split(",")]
kernel = qet._gemv_kernel
ptrs = {"x_ptr": "*bf16", "out_ptr": "*bf16", "w_ptr": "*u8", "h_ptr": "*i16", "v_ptr": "*i32", "kv_ptr": "*fp32",
        "part_ptr": "*fp32", "cnt_ptr": "*i32"}
bn, bk, warps = qet._GEMV_BN, qet.gemv_tile_k(k), qet._GEMV_WARPS
found = {}
for mb in mbs:
    consts = {"QT": EXTRA_TYPES[qtype].code, "BN": bn, "BK": bk, "MB": mb, "MP": triton.next_power_of_2(mb),
              "SPLIT": split, "PDL": True, "HALVES": halves}
    sig = {p.name: "constexpr" if p.name in consts else ptrs.get(p.name, "i32") for p in kernel.params}
    # As launches specialize them: 16-byte aligned tensors, and SmolLM2's N and strides of x and out.
    aligned = [i for i, p in enumerate(kernel.params) if p.name in (*ptrs, "N", "stride_x", "stride_o")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned} if aligned_args else {}
    try:
        compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    except Exception as e:  # no CUDA compiler in this install
        print(repr(e)[:300], file=sys.stderr)
        sys.exit(3)
    ttgir = compiled.asm["ttgir"]
    encodings = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))
    operands = re.findall(r'"tt\.reduce"\(.*?\}\) : \((tensor<.*?>)\) ->', ttgir, re.S)
    found[mb] = sorted({re.sub(r"#\w+", lambda a: encodings.get(a.group(0), a.group(0)), t) for t in operands})
print(json.dumps(found))
"""


@pytest.mark.parametrize("qtype,k,split,aligned,halves", [
    ("Q4_1", 576, True, True, False), ("Q4_1", 576, False, True, False), ("Q4_1", 576, True, False, False),
    ("Q4_1", 1536, True, True, False), ("Q5_1", 576, True, True, False), ("Q3_K", 512, True, True, False),
    ("Q4_1", 576, True, True, True), ("Q4_1", 576, False, True, True)])
def test_gemv_gpu_code_reduces_every_row_in_one_layout_whatever_the_batch(qtype: str, k: int, split: bool,
                                                                          aligned: bool, halves: bool) -> None:
    """The interpreter cannot show the GPU's summation order; the compiled code can. Every row's
    accumulator is reduced from the same tensor layouts at 1, 9 and 16 rows: the compiler did not
    lay a row's sums out differently because the batch grew."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = str(Path(__file__).resolve().parents[2])  # this tree's mlxr
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    args = [qtype, str(k), str(int(split)), str(int(aligned)), "1,9,16", str(int(halves))]
    proc = subprocess.run([sys.executable, "-c", _REDUCE_LAYOUTS, *args],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode == 3:
        pytest.skip(f"no sm_90 compile here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    layouts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert layouts["1"], layouts  # the one row's reductions (Q4_1: three nested sums) were found
    assert all(v == layouts["1"] for v in layouts.values()), layouts  # and no other kind at 9 or 16 rows


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", [{"bn": 4, "warps": 1}, {"bn": 32, "bk": 32, "warps": 4}, {"bn": 16, "split": 3},
                                    {"halves": False}, {"halves": False, "split": 1}, {"halves": False, "bk": 32}])
def test_gemv_launch_variants_of_the_probe_agree_with_gguf_py(config: dict, device: str) -> None:
    """bench/probes/extra_gemv.py sweeps these knobs; each must still compute the product."""
    qtype, n, k = "Q4_1", 40, 576
    raw = random_blocks(qtype, n, k, seed=9)
    w64 = torch.from_numpy(reference_dequantize(raw, qtype, n, k)).double()
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(3))
    ref = x.double() @ w64.T
    out = qmatmul_extra_triton(x.to(device), torch.from_numpy(raw).to(device), qtype, k, config=config).cpu().double()
    assert (out - ref).norm() / ref.norm() < 1e-5, config


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split", [None, 1])
def test_q4_1_one_tile_row_is_bit_identical_whatever_the_batch(split, device: str) -> None:
    """The one-tile Q4_1 order (MLXR_Q4_1_HALVES=0; the default tile is two halves, which the
    tests above cover) keeps a row's sums independent of the batch too."""
    qtype, k = "Q4_1", 576
    n = 12 if device == "cpu" else 1000
    t = torch.from_numpy(random_blocks(qtype, n, k, seed=5)).to(device)
    config = {"halves": False, **({"split": split} if split else {})}
    row = torch.randn(1, k, generator=torch.Generator().manual_seed(0)).to(device)
    alone = qmatmul_extra_triton(row, t, qtype, k, config=config)
    for m, at in ((2, 1), (9, 4)):
        batch = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
        batch[at] = row[0]
        assert torch.equal(qmatmul_extra_triton(batch, t, qtype, k, config=config)[at:at + 1], alone), (m, at)
