"""`mlxr cp SOURCE DESTINATION`: register a model under another name."""
from __future__ import annotations

import argparse

from mlxr.cli.registry_access import add_verb, errors_exit_1, open_registry


def register(sub: argparse._SubParsersAction) -> dict:
    p = add_verb(sub, "cp", "register a model under another name")
    p.add_argument("source")
    p.add_argument("destination")
    return {"cp": cmd_cp}


@errors_exit_1
def cmd_cp(ns: argparse.Namespace) -> int:
    record = open_registry(ns).copy(ns.source, ns.destination)
    print(f"copied '{ns.source}' to '{record.name}'")
    return 0
