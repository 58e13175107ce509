"""`mlxr import PATH [--name NAME] [--mmproj PROJ.gguf]`: register a .gguf file (with
llama.cpp's mmproj file for its images) or a Hugging Face directory."""
from __future__ import annotations

import argparse
from pathlib import Path

from mlxr.cli.registry_access import add_verb, errors_exit_1, open_registry


def register(sub: argparse._SubParsersAction) -> dict:
    p = add_verb(sub, "import", "register a .gguf file or a Hugging Face model directory")
    p.add_argument("path", type=Path)
    p.add_argument("--name", default=None, help="name:tag (default: from the file name)")
    p.add_argument("--mmproj", type=Path, default=None,
                   help="llama.cpp's mmproj GGUF (vision tower and projector) for a GGUF model's images")
    return {"import": cmd_import}


@errors_exit_1
def cmd_import(ns: argparse.Namespace) -> int:
    from mlxr.cli.progress import progress_bar
    from mlxr.loader.preflight import check_loadable

    with progress_bar(f"hashing {ns.path.name}", in_bytes=True) as update:
        record = open_registry(ns).import_model(ns.path, ns.name, update, check=check_loadable, projector=ns.mmproj)
    with_projector = f" with its projector {record.projector}" if record.projector else ""
    print(f"imported {record.name} ({record.short_id}) from {record.path}{with_projector}")
    return 0
