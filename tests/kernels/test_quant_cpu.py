"""CPU kernels for GGUF blocks (mlxr/ops/quant/quant.c) against gguf-py's numpy dequantizer:
dequantization bit-exact, matmuls within the arithmetic of int8 activations, on every kernel
path this CPU can run: the native build (AVX-512 VNNI where the CPU has it), the AVX2 build
(x86-64-v3) and the portable C build."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from mlxr.layers.quant_linear import PackedWeight, QuantEmbedding, QuantLinear
from mlxr.ops.quant import cpu as quant_cpu
from mlxr.ops.quant.block_types import CPU_INT_TYPES
from mlxr.ops.quant.quant import CPU_GEMM_MIN_ROWS

if not quant_cpu.available():
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)

TYPES = list(CPU_INT_TYPES)
# Byte offsets of the fp16 scales in each block (random bytes there could be inf/NaN).
HALF_AT = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q4_1": [0, 2]}


def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    return set(next((line for line in text.splitlines() if line.startswith("flags")), "").split())


HAS_AVX2 = {"avx2", "fma", "f16c"} <= _cpu_flags()
BUILDS = ["native", pytest.param("x86-64-v3", id="avx2", marks=pytest.mark.skipif(not HAS_AVX2, reason="no AVX2")),
          pytest.param("x86-64", id="portable-c")]


def random_blocks(qtype: str, n: int, k: int, seed: int = 0, extremes: bool = False) -> np.ndarray:
    t = CPU_INT_TYPES[qtype]
    rng = np.random.default_rng(seed)
    nb = k // t.block_elems
    blocks = rng.integers(0, 256, (n, nb, t.block_bytes), dtype=np.uint8)
    d = rng.uniform(1e-3, 2e-2, (n, nb)) * rng.choice([-1.0, 1.0], (n, nb))
    if extremes:
        blocks[0, -1, :] = 0xFF  # every code (and 6-bit scale) at its largest value
        d[0, 0], d[-1, -1] = 0.0, 6.1e-5  # a zero scale; the smallest normal fp16 scale
    for at in HALF_AT[qtype]:
        blocks[:, :, at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(n, nb, 2)
    return blocks.reshape(n, nb * t.block_bytes)


def gguf_dequant(raw: np.ndarray, qtype: str) -> np.ndarray:
    return dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32)


def kernel_activations(x: np.ndarray) -> np.ndarray:
    """x as the kernel sees it: per 32 columns, 256*hi + lo units of absmax/127/256, where hi is
    x rounded to int8 over the block's absmax and lo the remainder rounded to int8."""
    b = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    d1 = amax / np.float32(127)
    unit = d1 / np.float32(256)
    safe = np.where(amax > 0, amax, 1)
    hi = np.clip(np.rint(b * (np.float32(127) / safe)), -127, 127)
    lo = np.clip(np.rint((b - hi * d1) * np.where(amax > 0, 1 / np.where(unit > 0, unit, 1), 0)), -127, 127)
    return ((256 * hi + lo).astype(np.float64) * unit).reshape(x.shape)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n,k", [(1, 256), (3, 512), (64, 768)])
@pytest.mark.parametrize("extremes", [False, True])
def test_dequantize_is_bit_exact_to_gguf_py(qtype, n, k, extremes):
    raw = random_blocks(qtype, n, k, seed=n + k, extremes=extremes)
    ours = quant_cpu.dequantize_cpu(torch.from_numpy(raw), qtype, k).numpy()
    ref = gguf_dequant(raw, qtype)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0", "Q4_1"])
def test_dequantize_small_blocks_at_odd_widths(qtype):
    raw = random_blocks(qtype, 5, 96)
    ours = quant_cpu.dequantize_cpu(torch.from_numpy(raw), qtype, 96).numpy()
    assert np.array_equal(ours.view(np.uint32), gguf_dequant(raw, qtype).view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES)
def test_row_lookup_equals_full_dequantization(qtype):
    raw = torch.from_numpy(random_blocks(qtype, 9, 512))
    full = quant_cpu.dequantize_cpu(raw, qtype, 512)
    rows = torch.tensor([[8, 0], [3, 3]])
    assert torch.equal(quant_cpu.dequantize_rows_cpu(raw, rows, qtype, 512), full[rows])


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("k", [256, 1280, 4352])
def test_qmatmul_matches_dequantize_then_matmul(build, qtype, m, k):
    """Exact up to fp32 summation order against the same rounded activations; and within
    their rounding (16 bits per 32 columns) of the unrounded product. k=4352: rows wider
    than the kernel's 2048-column slices (three slices, the last a short one)."""
    lib = quant_cpu.library(build)
    if lib is None:
        pytest.skip(f"cannot build the {build} variant")
    n = 37
    raw = random_blocks(qtype, n, k, seed=m)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block (scale 0)
    w = gguf_dequant(raw, qtype).astype(np.float64)
    ours = quant_cpu.qmatmul_cpu(torch.from_numpy(x), torch.from_numpy(raw), qtype, k, lib=lib).numpy()
    seen = kernel_activations(x)
    same_inputs = seen @ w.T
    scale = np.abs(seen) @ np.abs(w).T
    assert np.all(np.abs(ours - same_inputs) <= 1e-5 * scale + 1e-6)
    exact = x.astype(np.float64) @ w.T
    assert np.linalg.norm(ours - exact) <= 1e-4 * np.linalg.norm(exact)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0", "Q4_1"])
@pytest.mark.parametrize("m", [1, 3, 8, 11])
@pytest.mark.parametrize("k", [96, 224, 640, 2144])
def test_qmatmul_at_widths_that_end_in_a_partial_group(build, qtype, m, k):
    """32-column types whose rows end inside a 256-column group: with 1-4 blocks (96, Gemma 3's
    640; 2144: in the second 2048-column slice) the kernel folds that group, with 5-7 (224) it
    does not; row counts that fill one row tile, several, or leave a short last tile."""
    lib = quant_cpu.library(build)
    if lib is None:
        pytest.skip(f"cannot build the {build} variant")
    raw = random_blocks(qtype, 29, k, seed=k + m)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    w = gguf_dequant(raw, qtype).astype(np.float64)
    ours = quant_cpu.qmatmul_cpu(torch.from_numpy(x), torch.from_numpy(raw), qtype, k, lib=lib).numpy()
    seen = kernel_activations(x)
    assert np.all(np.abs(ours - seen @ w.T) <= 1e-5 * (np.abs(seen) @ np.abs(w).T) + 1e-6)


def test_kernel_builds_report_their_simd_level():
    native = quant_cpu.library("native").mlxr_simd_level()
    assert native == (2 if {"avx512_vnni", "avx512bw", "avx512vl", "gfni"} <= _cpu_flags() else 1 if HAS_AVX2 else 0)
    if HAS_AVX2:
        assert quant_cpu.library("x86-64-v3").mlxr_simd_level() == 1
    portable = quant_cpu.library("x86-64")
    if portable is not None:
        assert portable.mlxr_simd_level() == 0


@pytest.mark.parametrize("choice,path", [("portable", "portable"), ("avx2", "avx2"), ("bogus", None)])
def test_mlxr_cpu_kernels_forces_a_path(monkeypatch, choice, path):
    """The dispatcher's override: every layer then runs that path (a bad value: native, logged)."""
    from mlxr.ops.cpu import cpu_build as build

    if choice == "avx2" and not HAS_AVX2:
        pytest.skip("no AVX2")
    native = quant_cpu.kernel_path()
    monkeypatch.setenv("MLXR_CPU_KERNELS", choice)
    build.load_library.cache_clear()
    try:
        assert quant_cpu.kernel_path() == (path or native)
        raw = random_blocks("Q4_K", 16, 256)
        layer = QuantLinear(PackedWeight(torch.from_numpy(raw), "Q4_K", (16, 256)))
        x = torch.randn(3, 256)
        ref = x @ torch.from_numpy(gguf_dequant(raw, "Q4_K")).T
        assert float((layer(x) - ref).norm() / ref.norm()) < 1e-4
    finally:
        monkeypatch.delenv("MLXR_CPU_KERNELS")
        build.load_library.cache_clear()


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K", "Q4_1"])
@pytest.mark.parametrize("rows", [1, CPU_GEMM_MIN_ROWS, 40])
def test_quant_linear_agrees_with_float_linear_on_both_paths(qtype, rows):
    """The integer kernel at every row count (VNNI build); the portable build takes the fp32
    GEMM over the dequantized weight from CPU_GEMM_MIN_ROWS rows."""
    raw = random_blocks(qtype, 48, 512)
    packed = PackedWeight(torch.from_numpy(raw), qtype, (48, 512))
    bias = torch.randn(48)
    layer = QuantLinear(packed, bias)
    x = torch.randn(2, rows, 512)
    w = torch.from_numpy(gguf_dequant(raw, qtype))
    ref = torch.nn.functional.linear(x, w, bias)
    out = layer(x)
    assert out.shape == (2, rows, 48) and out.dtype == torch.float32
    assert float((out - ref).norm() / ref.norm()) < 1e-4


def test_quant_embedding_looks_up_exact_rows():
    raw = random_blocks("Q8_0", 50, 64)
    emb = QuantEmbedding(PackedWeight(torch.from_numpy(raw), "Q8_0", (50, 64)), torch.float32)
    ids = torch.tensor([[1, 49, 0]])
    assert torch.equal(emb(ids), torch.from_numpy(gguf_dequant(raw, "Q8_0"))[ids])


def test_packed_weight_rejects_a_wrong_byte_shape():
    with pytest.raises(ValueError, match="needs uint8"):
        PackedWeight(torch.zeros(4, 143, dtype=torch.uint8), "Q4_K", (4, 256))


def test_without_a_compiler_quantized_layers_fall_back_to_torch(monkeypatch, tmp_path):
    from mlxr.ops.cpu import cpu_build as build

    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MLXR_CACHE_DIR", str(tmp_path))
    build.load_library.cache_clear()
    try:
        assert not quant_cpu.available()
        raw = random_blocks("Q4_K", 16, 256)
        layer = QuantLinear(PackedWeight(torch.from_numpy(raw), "Q4_K", (16, 256)))
        emb = QuantEmbedding(PackedWeight(torch.from_numpy(raw), "Q4_K", (16, 256)), torch.float32)
        x = torch.randn(3, 256)
        w = torch.from_numpy(gguf_dequant(raw, "Q4_K"))
        torch.testing.assert_close(layer(x), x @ w.T, rtol=1e-5, atol=1e-5)
        assert torch.equal(emb(torch.tensor([2, 15])), w[[2, 15]])
    finally:
        build.load_library.cache_clear()


def test_matmuls_from_several_threads_at_once_match_one_at_a_time():
    """The kernels' work pool (ops/quant/pool.h) serves one job at a time and runs a concurrent
    caller's job inline (two models served at once): every result equals the lone call's, at
    1, 2 and 4 threads, with jobs of one chunk and of many."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = []
    for i, (qtype, n, k) in enumerate([("Q4_K", 640, 1024), ("Q8_0", 4096, 256), ("Q6_K", 31, 256)]):
        raw = torch.from_numpy(random_blocks(qtype, n, k, seed=i))
        jobs.append((torch.randn(3, k), raw, qtype, k))
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            want = [quant_cpu.qmatmul_cpu(*job) for job in jobs]

            def run(i: int) -> bool:
                torch.set_num_threads(threads)  # per OS thread
                return all(torch.equal(quant_cpu.qmatmul_cpu(*jobs[j % 3]), want[j % 3]) for j in range(i, i + 60))

            with ThreadPoolExecutor(4) as ex:
                assert all(ex.map(run, range(8)))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("env, policy, pooled", [(None, "PASSIVE", [1, 1, 0, 0]), (None, None, [0, 0, 0, 0]),
                                                 ("1", None, [1, 1, 1, 1]), ("0", "PASSIVE", [0, 0, 0, 0])])
def test_decode_sized_matmuls_take_the_pool_and_prompts_openmp(env, policy, pooled):
    """Under OMP_WAIT_POLICY=PASSIVE (mlxr's setting) matmuls of up to 8 rows (decode, small
    batches) run on pool.h's helpers and prompts on OpenMP's team; with OpenMP's threads spinning
    (libgomp's default) all run on the team; MLXR_POOL=1 / 0 sends every matmul to one of them
    (read once a process, so each case runs in its own)."""
    import os
    import subprocess
    import sys

    code = ("import ctypes; from mlxr.ops.quant import cpu as quant_cpu; lib = quant_cpu.library(); "
            "lib.mlxr_pool_rows.argtypes = [ctypes.c_int64]; print([lib.mlxr_pool_rows(m) for m in (1, 8, 9, 128)])")
    environ = {k: v for k, v in os.environ.items() if k not in ("MLXR_POOL", "OMP_WAIT_POLICY")}
    environ |= ({"MLXR_POOL": env} if env else {}) | ({"OMP_WAIT_POLICY": policy} if policy else {})
    done = subprocess.run([sys.executable, "-c", code], check=True, timeout=300, env=environ, capture_output=True, text=True)
    assert done.stdout.strip() == str(pooled)


def test_the_pool_instead_of_openmp_gives_the_same_results(tmp_path):
    """MLXR_POOL=1 and 0 (bench/threads.py's A/B of the pool) split a decode's rows over the pool
    or OpenMP's team; each output is computed by one thread either way, so the results are
    identical."""
    import os
    import subprocess
    import sys

    raw = random_blocks("Q4_K", 300, 512, seed=3)
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    np.save(tmp_path / "raw.npy", raw)
    np.save(tmp_path / "x.npy", x)
    code = ("import numpy as np, torch, sys; from mlxr.ops.quant import cpu as quant_cpu; torch.set_num_threads(2); "
            "d = sys.argv[1]; y = quant_cpu.qmatmul_cpu(torch.from_numpy(np.load(d + '/x.npy')), "
            "torch.from_numpy(np.load(d + '/raw.npy')), 'Q4_K', 512); np.save(d + '/y.npy', y.numpy())")
    outputs = []
    for pool in ("1", "0"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=300,
                       env={**os.environ, "MLXR_POOL": pool})
        outputs.append(np.load(tmp_path / "y.npy"))
    assert np.array_equal(*outputs)


@pytest.mark.parametrize("vendor, hint", [("GenuineIntel", 2), ("AuthenticAMD", 0), ("", 0)])
def test_the_weight_prefetch_hint_follows_the_cpu_vendor(monkeypatch, vendor, hint):
    from mlxr.ops.cpu import cpu_build as build

    monkeypatch.setattr(build, "_cpuinfo_field", lambda name: f"{name}\t: {vendor}" if name == "vendor_id" else "")
    flags = build.build_flags("native")
    assert f"-DMLXR_PREFETCH_HINT={hint}" in flags and sum(f.startswith("-DMLXR_PREFETCH_HINT") for f in flags) == 1


@pytest.mark.slow  # two more builds of the C library (~30 s); a change to the hint or the build flags runs it
def test_builds_with_either_prefetch_hint_give_identical_matmuls(monkeypatch, tmp_path):
    """The hint changes only where weight lines are cached: both builds (separate libraries)
    return the same bits for decode rows and a prompt tile."""
    from mlxr.ops.cpu import cpu_build as build

    raw = torch.from_numpy(random_blocks("Q4_K", 300, 1024, seed=3))
    x = torch.randn(9, 1024)
    out = {}
    monkeypatch.setenv("MLXR_CACHE_DIR", str(tmp_path))
    try:
        for vendor in ("GenuineIntel", "AuthenticAMD"):
            monkeypatch.setattr(build, "_cpuinfo_field", lambda name, v=vendor: f"{name}\t: {v}" if name == "vendor_id" else "")
            build.load_library.cache_clear()
            lib = build.load_library("quant")
            assert lib is not None
            out[vendor] = [quant_cpu.qmatmul_cpu(x[:m], raw, "Q4_K", 1024, lib=quant_cpu.library()) for m in (1, 9)]
        assert len(list(tmp_path.glob("kernels/quant-*.so"))) == 2
        for a, b in zip(out["GenuineIntel"], out["AuthenticAMD"]):
            assert torch.equal(a, b)
    finally:
        build.load_library.cache_clear()
