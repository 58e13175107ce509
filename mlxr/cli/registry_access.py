"""What the model-management verbs (import, list, show, rm, cp) share: the --home option, the
registry it opens, and their exit code 1 on a typed error."""
from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mlxr.cli.options import DEFAULT_HOME, home_dir
from mlxr.errors import MLXRError

if TYPE_CHECKING:
    from mlxr.registry import Registry

Handler = Callable[[argparse.Namespace], int]


def add_verb(sub: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--home", type=Path, default=None,
                   help=f"data directory (default: $MLXR_HOME or {DEFAULT_HOME})")
    return p


def open_registry(ns: argparse.Namespace) -> Registry:
    from mlxr.registry import Registry  # late: `mlxr generate` need not load it

    return Registry(home_dir(ns.home))


def errors_exit_1(fn: Handler) -> Handler:
    @functools.wraps(fn)
    def run(ns: argparse.Namespace) -> int:
        try:
            return fn(ns)
        except MLXRError as e:
            print(f"error: {e.message}", file=sys.stderr)
            return 1

    return run
