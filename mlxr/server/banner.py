"""What `mlxr serve` prints once its models are loaded and warm: where the APIs and the web UI
are, what it serves on which device, whether a key is needed and how long a reply may run.
A terminal gets these lines; a pipe or a file gets them as one log record (JSON there)."""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Sequence
from typing import Any, TextIO

_log = logging.getLogger("mlxr.serve")
READY = "mlxr serve: ready"  # the banner's first words (tests and scripts wait for them)


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def banner_fields(config: Any, served: Sequence[Any], max_tokens_default: int) -> dict[str, str]:
    url = base_url(config.host, config.port)
    models = ", ".join(f"{s.name} ({'cuda' if s.engine.on_gpu else 'cpu'})" for s in served)
    key = "required (Authorization: Bearer KEY)" if config.api_keys else "not required"
    bound = (f"{max_tokens_default} tokens, or the context's remainder, unless a request sets its own"
             if max_tokens_default > 0 else "none: a reply may fill the context")
    return {"OpenAI API": f"{url}/v1", "Ollama API": url, "web UI": f"{url}/ui/",
            "models": models or "none loaded yet (loaded on the first request)", "API key": key,
            "reply bound": f"{bound} (--max-tokens-default)"}


def banner_lines(config: Any, served: Sequence[Any], max_tokens_default: int) -> list[str]:
    fields = banner_fields(config, served, max_tokens_default)
    head = f"{READY} on {base_url(config.host, config.port)}"
    return [head, *(f"  {name + ':':<12} {value}" for name, value in fields.items())]


def print_banner(config: Any, served: Sequence[Any], max_tokens_default: int, out: TextIO | None = None) -> None:
    lines = banner_lines(config, served, max_tokens_default)
    if out is None and not _is_terminal(sys.stdout):
        # A pipe or a file gets one line in the logs' own format (JSON there), not text among them.
        _log.info(lines[0], extra={"fields": banner_fields(config, served, max_tokens_default)})
        return
    # A closed or broken standard output (a daemon, `| head`) is no reason not to serve.
    with contextlib.suppress(OSError, ValueError):
        print("\n".join(lines), file=out or sys.stdout, flush=True)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False
