"""`mlxr ps`: the models a running server has loaded."""
from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request

from mlxr.cli.serve import DEFAULT_PORT, fail


def register(sub: argparse._SubParsersAction) -> dict:
    p = sub.add_parser("ps", help="models loaded in the running server")
    p.add_argument("--host", default=None, help="server host[:port] (default $MLXR_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--api-key", default=None)
    return {"ps": cmd_ps}


def cmd_ps(ns: argparse.Namespace) -> int:
    url = _server_url(ns) + "/api/ps"
    key = ns.api_key or os.environ.get("MLXR_API_KEY")
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            models = json.load(resp).get("models", [])
    except urllib.error.HTTPError as e:
        return fail(f"{url}: HTTP {e.code} {e.read().decode(errors='replace')[:200]}")
    except (urllib.error.URLError, OSError) as e:
        return fail(f"cannot reach the server at {url}: {e}")
    print(format_ps(models))
    return 0


def _server_url(ns: argparse.Namespace) -> str:
    host = ns.host or os.environ.get("MLXR_HOST") or "127.0.0.1"
    host = host.removeprefix("http://")
    if ns.port is not None:
        host = f"{host.rsplit(':', 1)[0] if host.count(':') == 1 else host}:{ns.port}"
    elif host.count(":") != 1:
        host = f"{host}:{DEFAULT_PORT}"
    return f"http://{host}"


def format_ps(models: list[dict]) -> str:
    rows = [("NAME", "ID", "SIZE", "CONTEXT", "UNTIL")]
    for m in models:
        digest = str(m.get("digest", "")).removeprefix("sha256:")[:12]
        rows.append((str(m.get("name", "")), digest, _human(m.get("size", 0)),
                     str(m.get("context_length", "")), str(m.get("expires_at", ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _human(size: object) -> str:
    n = float(size) if isinstance(size, (int, float)) else 0.0
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
