"""The C quant kernels as built on an ARM machine (aarch64, armv8-a: the portable C path, where
`char` is unsigned and no x86 intrinsic may leak in), run under qemu against gguf-py's
dequantizer (a reference we did not write): every kept type dequantizes bit-for-bit, and the
product of 1, 3 and 9 rows of activations matches float64 arithmetic on the reference weights.
Needs a cross compiler and qemu: installed from Debian (gcc-aarch64-linux-gnu qemu-user) when
missing, skipped when that fails."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from debian_tools import ensure_commands
from quant_blocks import random_blocks, reference_dequantize

from mlxr.ops.cpu_build import FLAGS, TARGETS

CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
OPS = Path(__file__).resolve().parents[1] / "mlxr" / "ops"
HARNESS = Path(__file__).resolve().parent / "aarch64" / "quant_harness.c"
CORE = {"Q4_0": 0, "Q5_0": 1, "Q8_0": 2, "Q4_K": 3, "Q5_K": 4, "Q6_K": 5, "Q4_1": 6}
EXTRA = {"Q4_1": 6, "Q5_1": 7, "Q2_K": 8, "Q3_K": 9, "IQ4_NL": 10, "IQ4_XS": 11}

@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    """The harness and both quant sources, built as cpu_build builds them for aarch64 (minus -shared)."""
    ensure_commands([CC, QEMU], ["gcc-aarch64-linux-gnu", "qemu-user"])
    out = tmp_path_factory.mktemp("aarch64") / "quant_harness"
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC")]
    cmd = [CC, f"-march={TARGETS['aarch64']['portable']}", *flags, "-Wall", "-Werror", "-o", str(out), str(HARNESS),
           str(OPS / "quant" / "quant.c"), str(OPS / "quant" / "quant_extra.c"), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def run(harness: Path, code: int, extra: bool, raw: np.ndarray, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    n, m = raw.shape[0], x.shape[0]
    head = np.array([code, n, k, m, raw.shape[1], int(extra)], dtype=np.int32)
    stdin = head.tobytes() + np.ascontiguousarray(raw).tobytes() + np.ascontiguousarray(x, dtype=np.float32).tobytes()
    proc = subprocess.run([QEMU, "-L", SYSROOT, str(harness)], input=stdin, capture_output=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    values = np.frombuffer(proc.stdout, dtype=np.float32)
    assert values.size == n * k + m * n, values.size
    return values[:n * k].reshape(n, k), values[n * k:].reshape(m, n)


CASES = [(q, c, False) for q, c in CORE.items()] + [(q, c, True) for q, c in EXTRA.items()]


@pytest.mark.parametrize("qtype,code,extra", CASES, ids=[f"{q}-{'extra' if e else 'core'}" for q, _, e in CASES])
def test_aarch64_build_matches_gguf_py(harness: Path, qtype: str, code: int, extra: bool) -> None:
    n, k = 24, 512
    raw = random_blocks(qtype, n, k, seed=code + 13 * extra)
    ref_w = reference_dequantize(raw, qtype, n, k)
    for m in (1, 3, 9):
        x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
        deq, y = run(harness, code, extra, raw, x, k)
        assert np.array_equal(deq, ref_w), (qtype, m, float(np.abs(deq - ref_w).max()))
        ref = x.astype(np.float64) @ ref_w.astype(np.float64).T
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-4, (qtype, m)
