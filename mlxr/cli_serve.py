"""`mlxr serve` (the HTTP daemon on uvicorn) and `mlxr ps` (what a running server has loaded)."""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_PORT = 11434  # Ollama's, so Ollama clients find us


def register(sub) -> dict:
    s = sub.add_parser("serve", help="serve models over HTTP (OpenAI and Ollama APIs)")
    s.add_argument("--model", "-m", action="append", default=[],
                   help="registry name or model path (imported first); repeatable; default: the bundled model")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    key = s.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="Bearer key required on every route but /health")
    key.add_argument("--api-key-file", default=None, help="file holding the API key (one line)")
    s.add_argument("--allow-unauthenticated", action="store_true",
                   help="allow a non-loopback --host without an API key")
    s.add_argument("--home", default=None, help="data directory (default $MLXR_HOME or ~/.mlxr)")
    s.add_argument("--device", default=None, help="cpu or cuda (default cpu)")
    s.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16")
    s.add_argument("--quantization", "-q", default=None, help="auto (keep quantized GGUF weights) | none | fp8 (Hopper GPUs)")
    s.add_argument("--keep-alive", default="5m", type=parse_duration,
                   help="unload idle models after this (\"5m\", seconds, -1 = never)")
    s.add_argument("--max-loaded-models", type=int, default=2)
    s.add_argument("--max-num-seqs", type=int, default=64)
    s.add_argument("--max-num-batched-tokens", type=int, default=2048)
    s.add_argument("--max-model-len", type=int, default=None)
    s.add_argument("--kv-cache-gb", type=float, default=1.0)
    s.add_argument("--max-waiting", type=int, default=1024, help="queue limit; past it requests get 503")
    s.add_argument("--cors-origin", action="append", default=[], help="allowed CORS origin; repeatable")
    s.add_argument("--shutdown-timeout", type=float, default=60.0,
                   help="seconds to let in-flight requests finish on SIGTERM/SIGINT")
    s.add_argument("--log-stats-every", type=float, default=5.0,
                   help="seconds between throughput log lines while busy")
    p = sub.add_parser("ps", help="models loaded in the running server")
    p.add_argument("--host", default=None, help="server host[:port] (default $MLXR_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--api-key", default=None)
    return {"serve": cmd_serve, "ps": cmd_ps}


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def api_keys(ns: argparse.Namespace) -> tuple[str, ...]:
    if ns.api_key_file:
        key = Path(ns.api_key_file).expanduser().read_text().strip()
        if not key:
            raise ValueError(f"{ns.api_key_file} is empty")
        return (key,)
    key = ns.api_key or os.environ.get("MLXR_API_KEY") or ""
    return (key,) if key else ()


def server_config(ns: argparse.Namespace, keys: tuple[str, ...], preload: tuple[str, ...]):
    from mlxr.config import EngineConfig, ServerConfig

    engine = EngineConfig(
        max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens,
        max_model_len=ns.max_model_len, kv_cache_memory_gb=ns.kv_cache_gb, max_waiting=ns.max_waiting,
    )
    return ServerConfig(
        host=ns.host, port=ns.port, api_keys=keys, allow_unauthenticated=ns.allow_unauthenticated,
        cors_origins=tuple(ns.cors_origin), keep_alive_s=ns.keep_alive,
        max_loaded_models=max(ns.max_loaded_models, len(preload)), preload=preload,
        home=str(home_dir(ns)), device=ns.device, dtype=ns.dtype, quantization=ns.quantization, engine=engine,
    )


def parse_duration(text: str) -> float:
    """"5m", "1h", "30s" or seconds; negative = forever (-1)."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--keep-alive: {text!r} is not a duration such as 5m, 1h or 30s")
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]
    return -1.0 if seconds < 0 else seconds


def home_dir(ns: argparse.Namespace) -> Path:
    return Path(ns.home or os.environ.get("MLXR_HOME") or "~/.mlxr").expanduser()


def register_models(registry, models: list[str]) -> tuple[str, ...]:
    """Registry names to preload: paths are imported first; none given = the bundled models
    (the chat model and the base completion model)."""
    if not models:
        return tuple(r.name for r in registry.ensure_all_bundled())
    names = []
    for m in models:
        path = Path(m).expanduser()
        names.append(registry.import_model(path).name if path.exists() else registry.resolve(m).name)
    return tuple(dict.fromkeys(names))


def cmd_serve(ns: argparse.Namespace) -> int:
    try:
        keys = api_keys(ns)
    except (OSError, ValueError) as e:
        return _fail(f"cannot read the API key: {e}")
    if not is_loopback(ns.host) and not keys and not ns.allow_unauthenticated:
        return _fail(f"refusing to listen on {ns.host} without an API key: pass --api-key or "
                     "--api-key-file, or --allow-unauthenticated if you mean it")
    from mlxr.registry import Registry
    from mlxr.server.logs import setup_json_logging

    setup_json_logging(_log_level(ns))
    registry = Registry(home_dir(ns))
    config = server_config(ns, keys, register_models(registry, ns.model))
    return run_server(config, registry, ns.shutdown_timeout, ns.log_stats_every)


def _log_level(ns: argparse.Namespace) -> str:
    # The global default (WARNING) would hide start-up and load lines; a daemon wants INFO.
    level = getattr(ns, "log_level", "INFO") or "INFO"
    return "INFO" if level.upper() == "WARNING" else level


def run_server(config, registry, shutdown_timeout: float, stats_every_s: float = 5.0) -> int:
    import uvicorn

    from mlxr.server.app import create_app

    app = create_app(config, registry, stats_every_s)
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown: stop accepting, let in-flight
    # requests (streams included) finish, then the app's lifespan shuts the engines down.
    uvicorn.run(app, host=config.host, port=config.port, log_config=None,
                timeout_graceful_shutdown=shutdown_timeout, access_log=False)
    return 0


def cmd_ps(ns: argparse.Namespace) -> int:
    url = _server_url(ns) + "/api/ps"
    key = ns.api_key or os.environ.get("MLXR_API_KEY")
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            models = json.load(resp).get("models", [])
    except urllib.error.HTTPError as e:
        return _fail(f"{url}: HTTP {e.code} {e.read().decode(errors='replace')[:200]}")
    except (urllib.error.URLError, OSError) as e:
        return _fail(f"cannot reach the server at {url}: {e}")
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
