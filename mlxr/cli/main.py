"""Builds the parser from the verb modules and maps typed errors to exit codes."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from mlxr.cli import (bench, cp, generate, import_model, list_models, perplexity, ps, pull, quantize, rm, run,
                      serve, show)
from mlxr.cli.options import add_log_format_option
from mlxr.config import openmp_environment
from mlxr.errors import MLXRError
from mlxr.server.logs import setup_logging

Handler = Callable[[argparse.Namespace], int]
# Help lists the verbs in this order.
VERBS = (generate, run, serve, ps, pull, import_model, list_models, show, rm, cp, bench, quantize, perplexity)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    p = argparse.ArgumentParser(prog="mlxr", description="Local-first LLM inference engine")
    p.add_argument("--log-level", default="WARNING")
    add_log_format_option(p)
    sub = p.add_subparsers(dest="command", required=True)
    handlers: dict[str, Handler] = {}
    for verb in VERBS:
        handlers.update(verb.register(sub))
    return p, handlers


def main(argv: list[str] | None = None) -> int:
    os.environ.update(openmp_environment(os.environ))  # before anything imports torch
    parser, handlers = build_parser()
    ns = parser.parse_args(argv)
    setup_logging(ns.log_level, ns.log_format)
    try:
        return handlers[ns.command](ns)
    except MLXRError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
