"""`mlxr quantize SRC --type q8_0|q4_0|q4_1|q6_k|q5_k_m|q4_k_m|q3_k_m|q2_k OUT.gguf [--register NAME]`."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]
# Kept literal so that building the parser does not import the quantizer (numpy, gguf).
TYPES = ("q8_0", "q4_0", "q4_1", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k")


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    """Add the quantize subcommand; returns {command: handler}."""
    p = sub.add_parser("quantize", help="write a quantized GGUF from an HF directory or an F32/F16/BF16 GGUF")
    p.add_argument("source", type=Path, help="Hugging Face model directory or unquantized .gguf")
    p.add_argument("--type", dest="qtype", required=True, choices=TYPES, help="llama.cpp file type")
    p.add_argument("output", type=Path, help="the .gguf file to write")
    p.add_argument("--register", metavar="NAME", default=None, help="also import the result under NAME")
    p.add_argument("--home", type=Path, default=None, help="data directory for --register (default: $MLXR_HOME or ~/.mlxr)")
    return {"quantize": cmd_quantize}


def cmd_quantize(ns: argparse.Namespace) -> int:
    from mlxr.cli.progress import progress_bar
    from mlxr.quantize import quantize_model

    with progress_bar(f"quantizing to {ns.qtype}") as update:
        report = _print_progress if update is None else lambda i, n, t: update(i, n)
        result = quantize_model(ns.source, ns.output, ns.qtype, report)
    counts: dict[str, int] = {}
    for t in result.tensors:
        counts[t.ggml_type] = counts.get(t.ggml_type, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"wrote {result.path} ({result.file_type}, {result.n_bytes / 2**20:.1f} MiB, {mix}) "
          f"in {result.seconds:.1f} s")
    if ns.register is not None:
        from mlxr.cli.options import home_dir
        from mlxr.registry import Registry

        record = Registry(home_dir(ns.home)).import_model(result.path, ns.register)
        print(f"registered {record.name} ({record.short_id})")
    return 0


def _print_progress(i: int, n: int, t) -> None:
    note = "" if t.ggml_type == t.wanted_type else f" (fallback for {t.wanted_type})"
    shape = "x".join(str(d) for d in t.shape)
    print(f"[{i:{len(str(n))}d}/{n}] {t.name:<32} {shape:>12} {t.ggml_type}{note}", file=sys.stderr, flush=True)
