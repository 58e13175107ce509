"""`mlxr rm MODEL`: unregister a model (its files are kept)."""
from __future__ import annotations

import argparse

from mlxr.cli.registry_access import add_verb, errors_exit_1, open_registry


def register(sub: argparse._SubParsersAction) -> dict:
    add_verb(sub, "rm", "unregister a model (its files are kept)").add_argument("model")
    return {"rm": cmd_rm}


@errors_exit_1
def cmd_rm(ns: argparse.Namespace) -> int:
    open_registry(ns).remove(ns.model)
    print(f"deleted '{ns.model}'")
    return 0
