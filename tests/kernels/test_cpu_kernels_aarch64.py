"""The C quant kernels as built on an ARM machine (aarch64: `char` is unsigned and no x86
intrinsic may leak in), in each of the three builds cpu_build can choose there: portable C
(armv8-a with quant.c's NEON kernels left out), NEON (armv8-a) and NEON with the dot product
instructions (armv8.2-a+dotprod). Each runs under qemu (the baseline builds on an armv8.0 core,
Cortex-A53, so an instruction past armv8-a would trap) against gguf-py's dequantizer (a
reference we did not write): every kept type dequantizes bit-for-bit, the product of 1, 3 and 9
rows of activations matches float64 arithmetic on the reference weights, and the NEON builds'
products equal the portable build's bit for bit (same integer sums, same float operations).
All three build with -Wall -Wextra and no warning. Needs a cross compiler and qemu: installed
from Debian (gcc-aarch64-linux-gnu qemu-user) when missing, skipped when that fails. The
dispatcher's choice between them is tested with /proc/cpuinfo texts of ARM CPUs."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from debian_tools import ensure_commands
from quant_blocks import F16_FIELDS, random_blocks, reference_dequantize

from mlxr.ops.cpu import cpu_build
from mlxr.ops.cpu.cpu_build import FLAGS, TARGETS, march_flags

CC, QEMU, OBJDUMP = "aarch64-linux-gnu-gcc", "qemu-aarch64", "aarch64-linux-gnu-objdump"
SYSROOT = "/usr/aarch64-linux-gnu"
OPS = Path(__file__).resolve().parents[2] / "mlxr" / "ops"
HARNESS = Path(__file__).resolve().parent / "aarch64" / "quant_harness.c"
CORE = {"Q4_0": 0, "Q5_0": 1, "Q8_0": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5, "Q4_1": 6}
EXTRA = {"Q4_1": 6, "Q5_1": 7, "Q2_K": 8, "Q3_K": 9, "IQ4_NL": 10, "IQ4_XS": 11}
# TARGETS["aarch64"] key -> (the qemu CPU that runs it, quant.c's mlxr_simd_level there)
BUILDS = {"portable": ("cortex-a53", 0), "neon": ("cortex-a53", 3), "dotprod": ("max", 4)}
ROWS = (1, 3, 9)


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory) -> dict[str, Path]:
    """The harness and both quant sources, built as cpu_build builds them for each aarch64
    target (minus -shared), with every warning of -Wall -Wextra an error."""
    ensure_commands([CC, QEMU, OBJDUMP], ["gcc-aarch64-linux-gnu", "qemu-user"])
    out = tmp_path_factory.mktemp("aarch64")
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC")]
    built, compiles = {name: out / f"quant_harness-{name}" for name in BUILDS}, {}
    for name, exe in built.items():  # at once: the three builds are most of this file's time
        cmd = [CC, *march_flags(TARGETS["aarch64"][name]), *flags, "-Wall", "-Wextra", "-Werror", "-o", str(exe),
               str(HARNESS), str(OPS / "quant" / "quant.c"), str(OPS / "quant" / "quant_extra.c"), "-lm"]
        compiles[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for name, proc in compiles.items():
        stderr = proc.communicate(timeout=300)[1]
        assert proc.returncode == 0 and "warning" not in stderr, (name, stderr[-2000:])
    return built


def run(harness: Path, cpu: str, code: int, extra: bool, raw: np.ndarray, xs: list[np.ndarray],
        k: int) -> tuple[int, np.ndarray, list[np.ndarray]]:
    """quant.c's SIMD level, the dequantized weights and the product with each of xs."""
    n, rows = raw.shape[0], [x.shape[0] for x in xs]
    head = np.array([code, n, k, raw.shape[1], int(extra), len(xs), *rows], dtype=np.int32)
    stdin = head.tobytes() + np.ascontiguousarray(raw).tobytes()
    stdin += b"".join(np.ascontiguousarray(x, dtype=np.float32).tobytes() for x in xs)
    proc = subprocess.run([QEMU, "-cpu", cpu, "-L", SYSROOT, str(harness)], input=stdin, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    values = np.frombuffer(proc.stdout[4:], dtype=np.float32)
    assert values.size == n * k + sum(rows) * n, values.size
    ends = np.cumsum([n * k] + [m * n for m in rows])
    products = [values[a:b].reshape(m, n) for a, b, m in zip(ends[:-1], ends[1:], rows)]
    return int(np.frombuffer(proc.stdout[:4], dtype=np.int32)[0]), values[:n * k].reshape(n, k), products


CASES = [(q, c, False) for q, c in CORE.items()] + [(q, c, True) for q, c in EXTRA.items()]


@pytest.mark.parametrize("qtype,code,extra", CASES, ids=[f"{q}-{'extra' if e else 'core'}" for q, _, e in CASES])
def test_aarch64_builds_match_gguf_py_and_each_other(harnesses: dict[str, Path], qtype: str, code: int,
                                                      extra: bool) -> None:
    n, k = 24, 512
    raw = random_blocks(qtype, n, k, seed=code + 13 * extra)
    ref_w = reference_dequantize(raw, qtype, n, k)
    xs = [np.random.default_rng(m).standard_normal((m, k)).astype(np.float32) for m in ROWS]
    refs = [x.astype(np.float64) @ ref_w.astype(np.float64).T for x in xs]
    products = {}
    for name, (cpu, level) in BUILDS.items():
        got, deq, products[name] = run(harnesses[name], cpu, code, extra, raw, xs, k)
        assert got == level, (name, got)
        assert np.array_equal(deq, ref_w), (qtype, name, float(np.abs(deq - ref_w).max()))
        for m, y, ref in zip(ROWS, products[name], refs):
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-4, (qtype, name, m)
    for name in ("neon", "dotprod"):
        for m, y, want in zip(ROWS, products[name], products["portable"]):
            assert np.array_equal(y, want), (qtype, name, m, float(np.abs(y - want).max()))


@pytest.mark.parametrize("qtype", CORE)
def test_neon_sums_at_their_widest_equal_the_portable_ones(harnesses: dict[str, Path], qtype: str) -> None:
    """Codes at their extremes (every code byte 0xFF, 0x7F or 0x80: Q8_0's 127, 255 and 0 as
    u, -1, 127 and -128 signed) against activations whose parts are both near 127 in magnitude
    (|xq| close to its bound 32639): no int32 lane saturates or wraps on any path."""
    n, k = 6, 512
    raw = random_blocks(qtype, n, k, seed=7).reshape(n, k // 256 if qtype.endswith("_K") else k // 32, -1)
    codes = np.ones(raw.shape[-1], dtype=bool)
    codes[[at + i for at in F16_FIELDS[qtype] for i in (0, 1)]] = False
    for row, byte in enumerate((0xFF, 0x7F, 0x80) * 2):
        raw[row, :, codes] = byte
    raw = raw.reshape(n, -1)
    signs = np.where(np.random.default_rng(1).random((2, k)) < 0.5, -1.0, 1.0)
    x = signs * np.array([126.5 / 127, 1.0])[:, None]  # hi 126, lo clamped at 127 (and hi 127, lo 0)
    x[:, ::32] = 1.0  # each block's absmax
    xs = [x.astype(np.float32)]
    y = {name: run(harnesses[name], cpu, CORE[qtype], False, raw, xs, k)[2][0] for name, (cpu, _) in BUILDS.items()}
    assert np.array_equal(y["neon"], y["portable"]) and np.array_equal(y["dotprod"], y["portable"])


def test_only_the_dotprod_build_has_dot_product_instructions(harnesses: dict[str, Path]) -> None:
    for name, exe in harnesses.items():
        text = subprocess.run([OBJDUMP, "-d", str(exe)], capture_output=True, text=True, check=True).stdout
        assert ("\tsdot\t" in text) == (name == "dotprod"), name


# /proc/cpuinfo's first core on a Neoverse N1 (Graviton2: the dot product, asimddp) and on a
# Cortex-A72 (Raspberry Pi 4, Graviton1: NEON only).
NEOVERSE_N1 = ("processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics "
               "fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n")
CORTEX_A72 = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"


@pytest.fixture
def fresh_choice(monkeypatch):
    """selected_march read anew (it is cached per process), and again after the test."""
    monkeypatch.delenv("MLXR_CPU_KERNELS", raising=False)
    cpu_build.selected_march.cache_clear()
    yield monkeypatch
    cpu_build.selected_march.cache_clear()


@pytest.mark.parametrize("machine,cpuinfo,env,march", [
    ("aarch64", NEOVERSE_N1, None, "armv8.2-a+dotprod"),
    ("aarch64", CORTEX_A72, None, "armv8-a"),
    ("aarch64", "", "auto", "armv8-a"),  # no /proc/cpuinfo: the baseline
    ("aarch64", NEOVERSE_N1, "neon", "armv8-a"),
    ("aarch64", NEOVERSE_N1, "portable", "armv8-a-portable"),
    ("aarch64", CORTEX_A72, "dotprod", "armv8.2-a+dotprod"),  # forced: the user's call
    ("aarch64", NEOVERSE_N1, "native", "native"),
    ("aarch64", CORTEX_A72, "avx2", "armv8-a"),  # not an ARM choice: logged, auto
    ("x86_64", "flags\t\t: fpu sse2 avx2\n", None, "native"),
    ("x86_64", "flags\t\t: fpu sse2 avx2\n", "dotprod", "native"),
])
def test_the_aarch64_target_follows_the_cpus_features(fresh_choice, machine: str, cpuinfo: str, env: str | None,
                                                       march: str) -> None:
    fresh_choice.setattr(cpu_build, "_machine", lambda: machine)
    fresh_choice.setattr(cpu_build, "_read_cpuinfo", lambda: cpuinfo)
    if env is not None:
        fresh_choice.setenv("MLXR_CPU_KERNELS", env)
    assert cpu_build.selected_march() == march


def test_aarch64_portable_is_armv8_a_without_the_neon_kernels(fresh_choice) -> None:
    fresh_choice.setattr(cpu_build, "_read_cpuinfo", lambda: NEOVERSE_N1)
    assert cpu_build.build_flags("armv8-a-portable")[:2] == ["-march=armv8-a", "-DMLXR_PORTABLE"]
    assert cpu_build.build_flags("armv8.2-a+dotprod")[0] == "-march=armv8.2-a+dotprod"
    # the features are part of the cached library's key, as x86's flags are
    signature = cpu_build._cpu_signature()
    fresh_choice.setattr(cpu_build, "_read_cpuinfo", lambda: CORTEX_A72)
    assert cpu_build._cpu_signature() != signature
