"""The `mlxr` command: one module per verb, each with register(subparsers) -> {verb: handler}."""
from mlxr.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
