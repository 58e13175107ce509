"""Compile mlxr/ops/cpu/*.c once per source and CPU, and load it with ctypes.

The library is built with the machine's C compiler (`CC`, default `cc`) for the host CPU
(-march=native, so AVX-512 VNNI where the CPU has it) and cached under
$MLXR_CACHE_DIR/kernels (default ~/.cache/mlxr/kernels) by a hash of the source, the flags and
the CPU's feature flags. Without a compiler the callers fall back to torch code.
OpenMP: torch is imported first, so the library binds to the libgomp torch already loaded and
shares its thread pool instead of starting a second one that would spin against it.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (loads torch's libgomp before ours; see above)

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]


def cache_dir() -> Path:
    root = os.environ.get("MLXR_CACHE_DIR") or Path.home() / ".cache" / "mlxr"
    return Path(root) / "kernels"


def _cpu_signature() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return os.uname().machine + flags


LIBRARIES = ("attention", "norm", "quant", "quant_extra")  # the *.c files beside this one


def _target(name: str, march: str, compiler: str, flags: list[str]) -> Path:
    source = Path(__file__).with_name(f"{name}.c")
    digest = hashlib.sha256(source.read_bytes() + " ".join([compiler, *flags, _cpu_signature()]).encode())
    return cache_dir() / f"{name}-{march}-{digest.hexdigest()[:16]}.so"


def unbuilt_libraries(march: str = "native") -> list[str]:
    """The libraries that the first call to load_library would compile (a front end shows
    progress for them instead of a silent pause)."""
    compiler, flags = os.environ.get("CC", "cc"), [f"-march={march}", *FLAGS]
    return [n for n in LIBRARIES if not _target(n, march, compiler, flags).exists()]


@functools.cache
def load_library(name: str, march: str = "native") -> ctypes.CDLL | None:
    """The compiled `name`.c beside this file, or None (logged once) when it cannot be built.
    `march` other than native builds a portable variant (tests use it for the plain-C path)."""
    source = Path(__file__).with_name(f"{name}.c")
    compiler = os.environ.get("CC", "cc")
    flags = [f"-march={march}", *FLAGS]
    target = _target(name, march, compiler, flags)
    try:
        if not target.exists():
            log.info("compiling CPU kernels %s.c (first use; cached in %s)", name, target.parent)
            _compile(compiler, flags, source, target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("CPU kernels unavailable (%s); quantized matmuls fall back to torch", exc)
        return None


def _compile(compiler: str, flags: list[str], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so concurrent processes never load a partial file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *flags, str(source), "-o", tmp, "-lm"],
                       check=True, capture_output=True, timeout=120)
        os.replace(tmp, target)
    except subprocess.CalledProcessError as exc:
        raise subprocess.SubprocessError(f"{compiler} failed: {exc.stderr.decode(errors='replace')[-500:]}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
