"""quant.c's matmul at prefill shapes (128 activation rows): this tree's kernel against the one
at a git ref, interleaved call by call, on the same random weights and activations.

  python bench/probes/prefill_matmul.py [--ref HEAD~3] [--threads 2] [--repeats 30]

The shapes are TinyLlama's (hidden 2048, MLP 5632: fused gate/up, down, q/o) and Gemma 3
270M's (hidden 640: fused gate/up, down), in the types their Q4_K_M files use. JSON to
bench/results/<day>/prefill_matmul-*.json: per shape the medians of both and their ratio.
"""
from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import cpu_model, median, print_table, write_result

from mlxr.ops.cpu import cpu_build
from mlxr.ops.quant import cpu as quant_cpu
from mlxr.ops.quant.block_types import QUANT_TYPES

ROOT = Path(__file__).resolve().parents[2]

SHAPES = [("Q4_K", 11264, 2048), ("Q4_K", 2048, 5632), ("Q6_K", 2048, 5632), ("Q4_K", 2048, 2048),
          ("Q8_0", 11264, 2048), ("Q8_0", 2048, 5632),
          ("Q5_0", 4096, 640), ("Q8_0", 4096, 640), ("Q4_K", 640, 2048)]


def library_at(ref: str, tmp: Path) -> ctypes.CDLL:
    """quant.c and its headers as they were at `ref`, built with cpu_build's flags."""
    folder = "mlxr/ops/quant"
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{ref}:{folder}"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith((".c", ".h")):
            blob = subprocess.run(["git", "show", f"{ref}:{folder}/{name}"], cwd=ROOT, check=True,
                                  capture_output=True).stdout
            (tmp / name).write_bytes(blob)
    target = tmp / "quant-ref.so"
    cpu_build._compile("cc", cpu_build.build_flags("native"), tmp / "quant.c", target)  # this build's flags, vendor defines too
    lib = ctypes.CDLL(str(target))
    lib.qmatmul = lib.mlxr_qmatmul
    lib.qmatmul.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                            ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.qmatmul.restype = ctypes.c_int
    return lib


def weights(qtype: str, n: int, k: int) -> torch.Tensor:
    """Random codes with a small finite fp16 scale (2^-8) in every block."""
    t = QUANT_TYPES[qtype]
    raw = torch.randint(0, 256, (n, t.row_bytes(k)), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    at = 208 if qtype == "Q6_K" else 0
    raw.view(-1, t.block_bytes)[:, at:at + 2] = torch.tensor([0x00, 0x1C], dtype=torch.uint8)
    if qtype in ("Q4_K", "Q5_K"):
        raw.view(-1, t.block_bytes)[:, 2:4] = torch.tensor([0x00, 0x1C], dtype=torch.uint8)
    return raw


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="HEAD~3")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--types", default="", help="comma-separated weight types to run (default: all)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ours = quant_cpu.library()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        theirs = library_at(a.ref, Path(tmp))
        for qtype, n, k in [s for s in SHAPES if not a.types or s[0] in a.types.split(",")]:
            raw, x = weights(qtype, n, k), torch.randn(a.rows, k)
            same = quant_cpu.qmatmul_cpu(x, raw, qtype, k, lib=ours) - quant_cpu.qmatmul_cpu(x, raw, qtype, k, lib=theirs)
            times = {"new": [], "ref": []}
            for _ in range(a.repeats):  # interleaved: new, ref, new, ref ...
                for key, lib in (("new", ours), ("ref", theirs)):
                    t0 = time.perf_counter()
                    quant_cpu.qmatmul_cpu(x, raw, qtype, k, lib=lib)
                    times[key].append(time.perf_counter() - t0)
            new_ms, ref_ms = median(times["new"]) * 1e3, median(times["ref"]) * 1e3
            rows.append({"shape": f"{qtype} {n}x{k} m={a.rows}", "new_ms": new_ms, "ref_ms": ref_ms,
                         "speedup": ref_ms / new_ms, "new_gmac_s": a.rows * n * k / new_ms / 1e6,
                         "max_abs_diff": float(same.abs().max())})
    write_result("prefill_matmul", {"cpu": cpu_model(), "threads": a.threads, "ref": a.ref, "rows": rows})
    print_table(rows, ["shape", "new_ms", "ref_ms", "speedup", "new_gmac_s", "max_abs_diff"])


if __name__ == "__main__":
    main()
