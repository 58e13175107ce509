"""`mlxr run [MODEL]`: interactive chat in the terminal."""
from __future__ import annotations

import argparse

from mlxr.cli.options import add_model_options, add_sampling_options, model_path, sampling_from


def register(sub: argparse._SubParsersAction) -> dict:
    r = sub.add_parser("run", help="interactive chat in the terminal")
    add_model_options(r, positional=True)
    r.add_argument("--system", default=None, help="system prompt")
    add_sampling_options(r, default_max=512)
    return {"run": cmd_run}


def cmd_run(ns: argparse.Namespace) -> int:
    from mlxr.cli.chat import chat_loop

    return chat_loop(model_path(ns.model), ns, sampling_from(ns))
