"""Compile the C kernels of mlxr/ops (each op's .c beside its Python wrapper, LIBRARIES) once
per source and CPU, and load them with ctypes.

The library is built with the machine's C compiler (`CC`, default `cc`) for the host CPU
(x86: -march=native; aarch64: see below) and cached under
$MLXR_CACHE_DIR/kernels (default ~/.cache/mlxr/kernels) by a hash of the source, the flags and
the CPU's feature flags. Without a compiler the callers fall back to torch code.
OpenMP: torch is imported first, so the library binds to the libgomp torch already loaded and
shares its thread pool instead of starting a second one that would spin against it.

Dispatch by CPU: the sources pick their kernels from what the build targets (quant.c: AVX-512
VNNI + GFNI, else AVX2, else NEON with sdot, else NEON, else portable C), and the build targets
the CPU at hand, so the choice is made on the machine that runs it. On aarch64 the target is one
of two named ones, by /proc/cpuinfo's Features (asimddp: armv8.2-a+dotprod, else armv8-a), not
native: those two are the builds tests/kernels/test_cpu_kernels_aarch64.py runs under qemu.
MLXR_CPU_KERNELS=avx2|portable (x86), dotprod|neon|portable (aarch64) or native builds that
target instead (tests use it to run every path this CPU can; a user, to rule a kernel out).
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

FLAGS = ["-O3", "-fopenmp", "-pthread", "-ffp-contract=off", "-shared", "-fPIC"]


def cache_dir() -> Path:
    root = os.environ.get("MLXR_CACHE_DIR") or Path.home() / ".cache" / "mlxr"
    return Path(root) / "kernels"


def _machine() -> str:
    return os.uname().machine


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpuinfo_field(name: str) -> str:
    """The first line of /proc/cpuinfo that starts with `name` (x86: flags, vendor_id; aarch64:
    Features), or ""."""
    return next((line for line in _read_cpuinfo().splitlines() if line.startswith(name)), "")


def _cpu_signature() -> str:
    return _machine() + _cpuinfo_field("flags") + _cpuinfo_field("Features")


# Weight prefetch hint of quant.c by CPU vendor (__builtin_prefetch's locality): AMD EPYC read
# decode weights fastest with the non-temporal hint (0); an Intel Xeon with AMX read them at half
# the rate with it, and at the same rate with any of the cached hints 1-3 (2: into L2).
PREFETCH_HINTS = {"GenuineIntel": 2}


def vendor_defines() -> list[str]:
    """Compiler defines this CPU's vendor selects (see PREFETCH_HINTS)."""
    vendor = _cpuinfo_field("vendor_id").partition(":")[2].strip()
    return [f"-DMLXR_PREFETCH_HINT={PREFETCH_HINTS.get(vendor, 0)}"]


def march_flags(march: str) -> list[str]:
    """The compiler's target flags for a TARGETS value (a -march, or a VARIANTS name)."""
    return VARIANTS.get(march, [f"-march={march}"])


def build_flags(march: str) -> list[str]:
    return [*march_flags(march), *FLAGS, *vendor_defines()]


# Library name -> its source, relative to mlxr/ops; a source #includes headers of its own folder.
LIBRARIES = {"attention": "attention/attention.c", "norm": "norm/norm.c", "quant": "quant/quant.c",
             "quant_extra": "quant/quant_extra.c", "half_linear": "half_linear/half_linear.c",
             "delta_rule": "delta_rule/delta_rule.c"}
# MLXR_CPU_KERNELS -> -march per machine: "native" is every feature of this CPU. Every aarch64
# CPU has NEON, so its portable C is armv8-a with quant.c's NEON kernels left out (VARIANTS): the
# compiler still vectorizes the plain C, as x86-64's SSE2 does.
TARGETS = {"x86_64": {"avx2": "x86-64-v3", "portable": "x86-64"},
           "aarch64": {"dotprod": "armv8.2-a+dotprod", "neon": "armv8-a", "portable": "armv8-a-portable"}}
VARIANTS = {"armv8-a-portable": ["-march=armv8-a", "-DMLXR_PORTABLE"]}


def auto_march() -> str:
    """The target of MLXR_CPU_KERNELS=auto: native, except on aarch64, where it is armv8.2-a+dotprod
    when the CPU has the dot product instructions (Features: asimddp; Graviton2+, Apple M, Ampere,
    Cortex-A76+), else armv8-a: targets whose kernels are tested (under qemu), where native
    would build for whatever the compiler makes of this core."""
    if _machine() != "aarch64":
        return "native"
    features = _cpuinfo_field("Features").partition(":")[2].split()
    return TARGETS["aarch64"]["dotprod" if "asimddp" in features else "neon"]


@functools.cache
def selected_march() -> str:
    """The -march of MLXR_CPU_KERNELS (auto or unset: auto_march(); read once, it is on the hot path)."""
    wanted = os.environ.get("MLXR_CPU_KERNELS", "auto").strip().lower()
    targets = TARGETS.get(_machine(), {})
    if wanted == "native":
        return "native"
    if wanted not in ("", "auto", *targets):
        log.error("MLXR_CPU_KERNELS=%r is not one of auto, native%s on this %s CPU: using auto", wanted,
                  "".join(f", {t}" for t in targets), _machine())
    return targets.get(wanted) or auto_march()


def _source(name: str) -> Path:
    return Path(__file__).parent.parent / LIBRARIES[name]


def _target(name: str, march: str, compiler: str, flags: list[str]) -> Path:
    source = _source(name)
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # #included by the sources
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join([compiler, *flags, _cpu_signature()]).encode())
    return cache_dir() / f"{name}-{march}-{digest.hexdigest()[:16]}.so"


def unbuilt_libraries(march: str | None = None) -> list[str]:
    """The libraries that the first call to load_library would compile (a front end shows
    progress for them instead of a silent pause)."""
    march = march or selected_march()
    compiler, flags = os.environ.get("CC", "cc"), build_flags(march)
    return [n for n in LIBRARIES if not _target(n, march, compiler, flags).exists()]


def load_library(name: str, march: str | None = None) -> ctypes.CDLL | None:
    """The compiled source of library `name` (LIBRARIES), or None (logged once) when it cannot be built.
    march: None for MLXR_CPU_KERNELS's choice (auto_march() by default); tests name older targets
    to run the AVX2 and portable paths."""
    return _load(name, march or selected_march())


def loaded_libraries() -> list[ctypes.CDLL]:
    """Every library loaded so far (cpu_plan.py records the calls into them)."""
    return list(_LOADED)


_LOADED: list[ctypes.CDLL] = []


def _clear_caches() -> None:
    _load.cache_clear()
    selected_march.cache_clear()


load_library.cache_clear = _clear_caches  # tests change CC, MLXR_CACHE_DIR or MLXR_CPU_KERNELS


@functools.cache
def _load(name: str, march: str) -> ctypes.CDLL | None:
    source = _source(name)
    compiler = os.environ.get("CC", "cc")
    flags = build_flags(march)
    target = _target(name, march, compiler, flags)
    try:
        if not target.exists():
            log.info("compiling CPU kernels %s (first use; cached in %s)", source.name, target.parent)
            _compile(compiler, flags, source, target)
        lib = ctypes.CDLL(str(target))
        _LOADED.append(lib)
        return lib
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
