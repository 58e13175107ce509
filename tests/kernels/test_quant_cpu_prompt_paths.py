"""quant.c's prompt paths against the same rounded activations: AMX tiles where the CPU has
them, weight panels on AVX-512 VNNI without (MLXR_AMX=0), the row kernel below each path's
minimum rows (quant_panel.h, quant_amx.h)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mlxr.ops.quant import cpu as quant_cpu
from mlxr.ops.quant.block_types import CPU_INT_TYPES
from test_quant_cpu import TYPES, gguf_dequant, kernel_activations, random_blocks

if not quant_cpu.available():
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)

AMX_TYPES = TYPES
needs_amx = pytest.mark.skipif(not quant_cpu.amx(), reason="no AMX-INT8 tiles on this CPU (or MLXR_AMX=0)")


def check_prompt_path(monkeypatch, qtype: str, m: int, k: int, min_rows: int) -> None:
    """The matmul as the environment routes it: exact up to fp32 summation order against the
    16-bit activations the kernels see, with weight rows that end mid panel (37 = 2 x 16 + 5),
    activation tiles that end mid tile, 32-column types' rows that end inside a 256-column group
    (640, 2144) and an all-zero activation block; equal to the VNNI row kernel (MLXR_AMX=0,
    MLXR_VNNI_PANELS=0) up to that order, and bitwise below min_rows (the row kernel ran)."""
    if k % CPU_INT_TYPES[qtype].block_elems:
        pytest.skip("K-quants take whole 256-column blocks")
    raw = random_blocks(qtype, 37, k, seed=m + k)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero activation block (scale 0)
    w = gguf_dequant(raw, qtype).astype(np.float64)
    args = (torch.from_numpy(x), torch.from_numpy(raw), qtype, k)
    ours = quant_cpu.qmatmul_cpu(*args).numpy()
    seen = kernel_activations(x)
    bound = 1e-5 * (np.abs(seen) @ np.abs(w).T) + 1e-6
    assert np.all(np.abs(ours - seen @ w.T) <= bound)
    monkeypatch.setenv("MLXR_AMX", "0")
    monkeypatch.setenv("MLXR_VNNI_PANELS", "0")
    rows = quant_cpu.qmatmul_cpu(*args).numpy()
    assert np.all(np.abs(ours - rows) <= 2 * bound)
    if m >= min_rows:
        assert not np.array_equal(ours, rows)  # a different summation order: tiles or panels ran
    else:
        assert np.array_equal(ours, rows)


@needs_amx
@pytest.mark.parametrize("qtype", AMX_TYPES)
@pytest.mark.parametrize("m", [32, 33, 47, 64, 128])
@pytest.mark.parametrize("k", [256, 640, 1280, 2144])
def test_amx_prompt_matmuls_match_the_same_rounded_activations(monkeypatch, qtype, m, k):
    """Prompts of 32+ rows (Q6_K: 64+) on AMX tiles."""
    check_prompt_path(monkeypatch, qtype, m, k, quant_cpu.amx_min_rows(qtype))


needs_vnni = pytest.mark.skipif(not quant_cpu.vectorized(), reason="no AVX-512 VNNI build on this CPU")


@needs_vnni
@pytest.mark.parametrize("qtype", AMX_TYPES)
@pytest.mark.parametrize("m", [16, 32, 47, 48, 128])
@pytest.mark.parametrize("k", [256, 640, 1280, 2144])
def test_vnni_panel_prompt_matmuls_match_the_same_rounded_activations(monkeypatch, qtype, m, k):
    """Without AMX (MLXR_AMX=0: as on AMD EPYC), prompts of 32+ rows (Q6_K: 48+) by weight
    panels on VNNI; below that the row kernel."""
    monkeypatch.setenv("MLXR_AMX", "0")
    check_prompt_path(monkeypatch, qtype, m, k, quant_cpu.panel_min_rows(qtype))


@needs_vnni
def test_vnni_panels_take_prompts_from_32_rows_without_amx(monkeypatch):
    monkeypatch.setenv("MLXR_AMX", "0")
    assert {q: quant_cpu.panel_min_rows(q) for q in ("Q4_K", "Q8_0", "Q6_K")} == {"Q4_K": 32, "Q8_0": 32, "Q6_K": 48}
    monkeypatch.setenv("MLXR_VNNI_PANELS", "0")
    assert quant_cpu.panel_min_rows("Q4_K") == 0


@needs_amx
def test_amx_minimum_rows_by_type():
    assert {q: quant_cpu.amx_min_rows(q) for q in ("Q4_K", "Q8_0", "Q6_K")} == {"Q4_K": 32, "Q8_0": 32, "Q6_K": 64}


@needs_amx
def test_mlxr_amx_0_turns_the_tiles_off(monkeypatch):
    assert quant_cpu.kernel_path() == "avx512-vnni+amx"
    monkeypatch.setenv("MLXR_AMX", "0")
    assert not quant_cpu.amx() and quant_cpu.kernel_path() == "avx512-vnni"


def test_pool_helpers_stop_spinning_while_other_processes_want_the_cores(tmp_path):
    """A pool helper preempted during its spin (the machine is shared) backs off: it sleeps
    after its jobs for a while instead of taking time slices from the decode and the other
    process (pool.h, POOL_BACKOFF_NS). Two CPU-bound processes per core (all pinned to the same
    two CPUs) make sure it is preempted."""
    import os
    import subprocess
    import sys

    code = ("import ctypes, time, torch; from mlxr.ops.quant import cpu as quant_cpu; torch.set_num_threads(2); "
            "lib = quant_cpu.library(); lib.mlxr_pool_backoffs.restype = ctypes.c_int64; "
            "raw = torch.randint(0, 256, (512, 544), dtype=torch.uint8); x = torch.randn(1, 512); "
            "end = time.time() + 4\n"
            "while time.time() < end and not lib.mlxr_pool_backoffs():\n"
            "    quant_cpu.qmatmul_cpu(x, raw, 'Q8_0', 512); time.sleep(0.00002)\n"
            "print(lib.mlxr_pool_backoffs())")
    cpus = sorted(os.sched_getaffinity(0))[:2]  # everything on two CPUs, however many the machine has

    def pinned() -> None:
        os.sched_setaffinity(0, cpus)

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pinned)
                for _ in range(2 * len(cpus))]
    try:
        done = subprocess.run([sys.executable, "-c", code], check=True, timeout=300, capture_output=True, text=True,
                              env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "MLXR_POOL": "1"}, preexec_fn=pinned)
    finally:
        for p in spinners:
            p.kill()
    assert int(done.stdout.strip()) > 0
