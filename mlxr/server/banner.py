"""What `mlxr serve` prints once its models are loaded and warm: where the APIs and the web UI
are, what it serves on which device, whether a key is needed and how long a reply may run.
A human reads it on the terminal; the logs say the same in their own lines."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any, TextIO

READY = "mlxr serve: ready"  # the banner's first words (tests and scripts wait for them)


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def banner_lines(config: Any, served: Sequence[Any], max_tokens_default: int) -> list[str]:
    url = base_url(config.host, config.port)
    models = ", ".join(f"{s.name} ({'cuda' if s.engine.on_gpu else 'cpu'})" for s in served)
    key = "required (Authorization: Bearer KEY)" if config.api_keys else "not required"
    bound = (f"{max_tokens_default} tokens, or the context's remainder, unless a request sets its own"
             if max_tokens_default > 0 else "none: a reply may fill the context")
    return [
        f"{READY} on {url}",
        f"  OpenAI API:  {url}/v1",
        f"  Ollama API:  {url}",
        f"  web UI:      {url}/ui/",
        f"  models:      {models or 'none loaded yet (loaded on the first request)'}",
        f"  API key:     {key}",
        f"  reply bound: {bound} (--max-tokens-default)",
    ]


def print_banner(config: Any, served: Sequence[Any], max_tokens_default: int, out: TextIO | None = None) -> None:
    # A closed or broken standard output (a daemon, `| head`) is no reason not to serve.
    with contextlib.suppress(OSError, ValueError):
        print("\n".join(banner_lines(config, served, max_tokens_default)), file=out or sys.stdout, flush=True)
