"""`mlxr list`: the registered models, as `ollama list` prints them."""
from __future__ import annotations

import argparse
from datetime import datetime, timezone

from mlxr.cli.registry_access import add_verb, errors_exit_1, open_registry


def register(sub: argparse._SubParsersAction) -> dict:
    add_verb(sub, "list", "list registered models")
    return {"list": cmd_list}


@errors_exit_1
def cmd_list(ns: argparse.Namespace) -> int:
    now = datetime.now(timezone.utc)
    rows = [("NAME", "ID", "SIZE", "MODIFIED")]
    for r in open_registry(ns).list():
        rows.append((r.name, r.short_id, human_bytes(r.size_bytes), ago(r.modified_at, now)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("    ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "    " + row[3])
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
