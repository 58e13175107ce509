"""Model management commands: `mlxr import`, `list`, `show`, `rm`, `cp`."""
from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from mlxr.errors import MLXRError

if TYPE_CHECKING:
    from mlxr.registry import Registry

Handler = Callable[[argparse.Namespace], int]
_DEFAULT_HOME = "~/.mlxr"


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    """Add the registry subcommands; returns {command: handler}."""
    p = _add(sub, "import", "register a .gguf file or a Hugging Face model directory")
    p.add_argument("path", type=Path)
    p.add_argument("--name", default=None, help="name:tag (default: from the file name)")
    _add(sub, "list", "list registered models")
    _add(sub, "show", "show a model's facts").add_argument("model")
    _add(sub, "rm", "unregister a model (its files are kept)").add_argument("model")
    p = _add(sub, "cp", "register a model under another name")
    p.add_argument("source")
    p.add_argument("destination")
    return {"import": cmd_import, "list": cmd_list, "show": cmd_show, "rm": cmd_rm, "cp": cmd_cp}


def _add(sub: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--home", type=Path, default=None,
                   help=f"data directory (default: $MLXR_HOME or {_DEFAULT_HOME})")
    return p


def home_dir(option: Path | None) -> Path:
    """--home, else $MLXR_HOME, else ~/.mlxr."""
    raw = option or os.environ.get("MLXR_HOME") or _DEFAULT_HOME
    return Path(raw).expanduser().absolute()


def _errors_exit_1(fn: Handler) -> Handler:
    @functools.wraps(fn)
    def run(ns: argparse.Namespace) -> int:
        try:
            return fn(ns)
        except MLXRError as e:
            print(f"error: {e.message}", file=sys.stderr)
            return 1

    return run


def _registry(ns: argparse.Namespace) -> Registry:
    from mlxr.registry import Registry  # late: `mlxr generate` need not load it

    return Registry(home_dir(ns.home))


@_errors_exit_1
def cmd_import(ns: argparse.Namespace) -> int:
    progress = _Progress() if sys.stderr.isatty() else None
    record = _registry(ns).import_model(ns.path, ns.name, progress)
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


@_errors_exit_1
def cmd_list(ns: argparse.Namespace) -> int:
    now = datetime.now(timezone.utc)
    rows = [("NAME", "ID", "SIZE", "MODIFIED")]
    for r in _registry(ns).list():
        rows.append((r.name, r.short_id, human_bytes(r.size_bytes), ago(r.modified_at, now)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("    ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "    " + row[3])
    return 0


@_errors_exit_1
def cmd_show(ns: argparse.Namespace) -> int:
    r = _registry(ns).resolve(ns.model)
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


@_errors_exit_1
def cmd_rm(ns: argparse.Namespace) -> int:
    _registry(ns).remove(ns.model)
    print(f"deleted '{ns.model}'")
    return 0


@_errors_exit_1
def cmd_cp(ns: argparse.Namespace) -> int:
    record = _registry(ns).copy(ns.source, ns.destination)
    print(f"copied '{ns.source}' to '{record.name}'")
    return 0


def human_bytes(n: int) -> str:
    """Decimal units as `ollama list` prints them: "253 MB", "4.7 GB"."""
    value, unit = float(n), "B"
    for next_unit in ("KB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, next_unit
    if value >= 10 or value == int(value):
        return f"{int(value)} {unit}"
    return f"{value:.1f} {unit}"


_SPANS = ((365 * 86400, "year"), (30 * 86400, "month"), (7 * 86400, "week"),
          (86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def ago(rfc3339: str, now: datetime) -> str:
    """ "3 minutes ago"-style age of an RFC 3339 time."""
    then = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    seconds = int((now - then).total_seconds())
    if seconds < 1:
        return "Less than a second ago"
    for span, unit in _SPANS:
        if seconds >= span:
            count = seconds // span
            return f"{count} {unit}{'s' if count > 1 else ''} ago"
    return "Less than a second ago"
