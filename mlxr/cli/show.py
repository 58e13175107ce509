"""`mlxr show MODEL`: a registered model's facts."""
from __future__ import annotations

import argparse

from mlxr.cli.list_models import human_bytes
from mlxr.cli.registry_access import add_verb, errors_exit_1, open_registry


def register(sub: argparse._SubParsersAction) -> dict:
    add_verb(sub, "show", "show a model's facts").add_argument("model")
    return {"show": cmd_show}


@errors_exit_1
def cmd_show(ns: argparse.Namespace) -> int:
    r = open_registry(ns).resolve(ns.model)
    facts = [
        ("name", r.name), ("architecture", r.architecture), ("parameters", r.parameter_size),
        ("context length", str(r.context_length)), ("quantization", r.quantization),
        ("format", r.format), ("size", human_bytes(r.size_bytes)), ("path", str(r.path)),
        ("digest", r.digest), ("modified", r.modified_at), ("last used", r.last_used_at or "never"),
    ]
    print("  Model")
    for key, value in facts:
        print(f"    {key:<16}{value}")
    return 0
