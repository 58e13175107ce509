"""`mlxr import PATH [--name NAME]`: register a .gguf file or a Hugging Face directory."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlxr.cli.registry_access import add_verb, errors_exit_1, open_registry


def register(sub: argparse._SubParsersAction) -> dict:
    p = add_verb(sub, "import", "register a .gguf file or a Hugging Face model directory")
    p.add_argument("path", type=Path)
    p.add_argument("--name", default=None, help="name:tag (default: from the file name)")
    return {"import": cmd_import}


@errors_exit_1
def cmd_import(ns: argparse.Namespace) -> int:
    progress = _Progress() if sys.stderr.isatty() else None
    record = open_registry(ns).import_model(ns.path, ns.name, progress)
    if progress is not None:
        progress.finish()
    print(f"imported {record.name} ({record.short_id}) from {record.path}")
    return 0


class _Progress:
    def __init__(self) -> None:
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // total if total else 100
        if pct != self.last:
            self.last = pct
            print(f"\rhashing {pct:3d}%", end="", file=sys.stderr, flush=True)

    def finish(self) -> None:
        print(file=sys.stderr)
