"""`mlxr serve`: the HTTP daemon (OpenAI and Ollama APIs) on uvicorn."""
from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import re
import socket
import sys
from pathlib import Path

from mlxr.cli.options import (
    add_device_options, add_log_format_option, add_threads_option, check_path_exists, home_dir, use_threads,
)
from mlxr.distributed.launch import add_parallel_options, parallel_from, run_node
from mlxr.config import KV_CACHE_DTYPES
from mlxr.errors import MLXRError

DEFAULT_PORT = 11434  # Ollama's, so Ollama clients find us
DEFAULT_MAX_TOKENS = 2048  # server/reply_budget.py's (not imported here: it imports FastAPI)


def register(sub: argparse._SubParsersAction) -> dict:
    s = sub.add_parser("serve", help="serve models over HTTP (OpenAI and Ollama APIs)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s.add_argument("--model", "-m", action="append", default=[],
                   help="registry name or model path (imported first); repeatable; none: the bundled models")
    s.add_argument("--mmproj", type=Path, default=None,
                   help="llama.cpp's mmproj GGUF (vision tower and projector) for the one --model GGUF path")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only by default)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (Ollama's, so Ollama clients find it)")
    key = s.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="Bearer key required on every route but /health")
    key.add_argument("--api-key-file", default=None, help="file holding the API key (one line)")
    s.add_argument("--allow-unauthenticated", action="store_true",
                   help="allow a non-loopback --host without an API key")
    s.add_argument("--home", default=None, help="data directory (None: $MLXR_HOME, else ~/.mlxr)")
    add_device_options(s)
    add_parallel_options(s)
    add_threads_option(s)
    s.add_argument("--keep-alive", default="5m", type=parse_duration,
                   help="unload idle models after this (\"5m\", seconds, -1 = never)")
    s.add_argument("--max-loaded-models", type=int, default=2,
                   help="models held in memory at once; loading another unloads the least recently used")
    s.add_argument("--max-num-seqs", type=int, default=64, help="requests a model runs at once, per step")
    s.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="tokens one engine step processes at most (prefill chunks and decode tokens)")
    s.add_argument("--step-time-target-ms", type=step_time_target_ms, default=500,
                   help="a step's target time: its tokens follow the device's measured speed, so a new "
                        "request waits about this long behind a long prompt (0: steps of "
                        "--max-num-batched-tokens; docs/serving.md)")
    s.add_argument("--max-model-len", type=int, default=None,
                   help="context length in tokens (None: the model's own, as far as the KV cache holds)")
    s.add_argument("--max-tokens-default", type=max_tokens_default, default=DEFAULT_MAX_TOKENS,
                   help="tokens a reply may run to when the request sets no max_tokens / max_completion_tokens "
                        "/ max_output_tokens / num_predict (the context's remainder when less; 0: no bound)")
    s.add_argument("--kv-cache-gb", type=float, default=1.0, help="device memory for the KV cache, in GB")
    s.add_argument("--num-kv-blocks", type=int, default=None, help="device KV blocks (overrides --kv-cache-gb)")
    s.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=None,
                   help="how the KV cache stores K and V: auto (the model's dtype), fp32, bf16, fp16, or packed "
                        "in blocks of 32 with a scale: fp8 (e4m3), q8_0, q4_0 (more blocks in --kv-cache-gb; "
                        "unset: OLLAMA_KV_CACHE_TYPE f16|q8_0|q4_0, else auto; docs/kv-cache.md)")
    s.add_argument("--kv-host-cache-gb", type=float, default=0.0,
                   help="host memory for prefix-cache blocks the device evicts (0 = off)")
    s.add_argument("--kv-cache-dir", default=None,
                   help="directory that keeps computed KV blocks across restarts (disk tier; off when unset)")
    s.add_argument("--kv-cache-disk-gb", type=float, default=10.0, help="size bound of --kv-cache-dir")
    s.add_argument("--kv-cache-preload", type=float, default=0.5,
                   help="at start, fill up to this fraction of the device KV cache with --kv-cache-dir's "
                        "most recently used blocks (0 = restore only when a request asks)")
    s.add_argument("--data-parallel-size", type=int, default=1,
                   help="engine cores per model, each its own process with its own KV cache (on CUDA a device "
                        "each, on the CPU a share of the CPUs); requests go by prefix-cache affinity, then load")
    s.add_argument("--kv-events-endpoint", default=None,
                   help="publish KV-cache events (vLLM's format, for llm-d / Dynamo routers) on a ZMQ PUB socket "
                        "bound here: tcp://127.0.0.1:5557 or ipc://PATH (off when unset)")
    s.add_argument("--kv-events-replay-endpoint", default=None,
                   help="a ZMQ ROUTER socket bound here resends recent event batches from a sequence number")
    s.add_argument("--kv-events-topic", default="", help="the topic frame of every KV event message")
    s.add_argument("--kv-events-allow-remote", action="store_true",
                   help="allow a non-loopback KV events address (the events carry every prompt's token ids)")
    s.add_argument("--max-waiting", type=int, default=1024, help="queue limit; past it requests get 503")
    s.add_argument("--speculative-method", choices=["suffix", "ngram", "draft", "eagle3", "mtp"], default=None,
                   help="speculative decoding: suffix trees over the request and recent outputs (suffix), "
                        "prompt lookup (ngram), a draft model (draft), an EAGLE-3 head (eagle3) or the model's "
                        "own MTP layer (mtp)")
    s.add_argument("--speculative-model", default=None,
                   help="--speculative-method eagle3: the head's directory; mtp: the checkpoint directory "
                        "holding the mtp.* tensors (default: the served model's, when it is a directory)")
    s.add_argument("--num-speculative-tokens", type=int, default=4, help="draft tokens per step at most")
    s.add_argument("--draft-model", default=None, help="the draft model of --speculative-method draft "
                   "(registry name or path; same vocabulary as the served models)")
    s.add_argument("--speculative-max-batch", type=int, default=8,
                   help="no drafts while more requests than this run")
    s.add_argument("--jump-forward", action=argparse.BooleanOptionalAction, default=None,
                   help="structured output: draft the tokens a grammar forces next (a schema's keys and "
                        "punctuation) and verify them in the step, up to --speculative-max-batch requests (env "
                        "MLXR_JUMP_FORWARD=0: off)")
    s.add_argument("--lora", action="append", default=[], type=lora_module, metavar="NAME=PATH",
                   help="serve a LoRA adapter (PEFT directory or GGUF LoRA) of the first --model as NAME; repeatable")
    s.add_argument("--enable-lora", action="store_true",
                   help="serve LoRA adapters (implied by --lora): /v1/load_lora_adapter loads more at run time")
    s.add_argument("--max-loras", type=int, default=4, help="LoRA adapters resident (and in one batch) at once")
    s.add_argument("--max-lora-rank", type=int, default=64, help="the largest LoRA rank an adapter may have")
    s.add_argument("--allow-remote-images", action="store_true",
                   help="fetch http(s) image URLs that requests name (OpenAI image_url); off, only data: URLs "
                        "are taken, so a request cannot make the server reach an internal address")
    s.add_argument("--stream-interval", type=stream_interval, default=1,
                   help="tokens a streamed response gathers per write (the first token and the end "
                        "are never held); more per write costs the server less per token at many streams")
    s.add_argument("--api-servers", type=api_servers, default=os.environ.get("MLXR_API_SERVERS", "1"),
                   help="API processes in front of each engine core (1-16; env MLXR_API_SERVERS): above 1 "
                        "the HTTP work spreads over several processes, the engine core runs in its own, and "
                        "only the --model models are served (pinned: no loading on demand, no unloading)")
    s.add_argument("--cors-origin", action="append", default=[], help="allowed CORS origin; repeatable")
    s.add_argument("--allowed-host", action="append", default=[],
                   help="Host header name allowed besides localhost (DNS rebinding guard); repeatable")
    s.add_argument("--shutdown-timeout", type=float, default=60.0,
                   help="seconds to let in-flight requests finish on SIGTERM/SIGINT")
    s.add_argument("--log-stats-every", type=float, default=5.0,
                   help="seconds between throughput log lines while busy")
    add_log_format_option(s, default=argparse.SUPPRESS)
    return {"serve": cmd_serve}


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def port_problem(host: str, port: int) -> str | None:
    """Why (host, port) cannot be listened on, or None: bound and let go at once (uvicorn binds
    it again once the models are loaded)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (OSError, OverflowError) as e:
        return f"cannot listen on {host}:{port}: {e}"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's: a TIME_WAIT port is free
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (f"port {port} on {host} is already in use (another mlxr or ollama serve?); "
                        "pick another with --port")
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def kv_events_problem(ns: argparse.Namespace) -> str | None:
    from mlxr.config import check_event_endpoint

    for flag, endpoint in (("--kv-events-endpoint", ns.kv_events_endpoint),
                           ("--kv-events-replay-endpoint", ns.kv_events_replay_endpoint)):
        try:
            if endpoint is not None:
                check_event_endpoint(flag, endpoint, ns.kv_events_allow_remote)
        except ValueError as e:
            return str(e)
    return None


def api_keys(ns: argparse.Namespace) -> tuple[str, ...]:
    if ns.api_key_file:
        key = Path(ns.api_key_file).expanduser().read_text().strip()
        if not key:
            raise ValueError(f"{ns.api_key_file} is empty")
        return (key,)
    given = ns.api_key if ns.api_key is not None else os.environ.get("MLXR_API_KEY")
    if given is not None and given and not given.strip():
        raise ValueError("the API key is blank")  # it would pass the bind check and match no request
    key = (given or "").strip()
    return (key,) if key else ()


def server_config(ns: argparse.Namespace, keys: tuple[str, ...], preload: tuple[str, ...],
                  draft: str | None = None):
    from mlxr.config import EngineConfig, ServerConfig

    kv_cache_dir = Path(ns.kv_cache_dir).expanduser().resolve() if ns.kv_cache_dir else None
    if kv_cache_dir is not None:  # refused now, before any model loads, if others could write it
        from mlxr.engine.kv.disk_dir import private_directory

        private_directory(kv_cache_dir)
    engine = EngineConfig(
        max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens,
        step_time_target_s=ns.step_time_target_ms / 1000, max_model_len=ns.max_model_len, kv_cache_memory_gb=ns.kv_cache_gb, max_waiting=ns.max_waiting,
        num_kv_blocks=ns.num_kv_blocks, kv_host_cache_gb=ns.kv_host_cache_gb,
        kv_cache_dir=str(kv_cache_dir) if kv_cache_dir else None,
        kv_cache_disk_gb=ns.kv_cache_disk_gb, kv_cache_preload=ns.kv_cache_preload, parallel=parallel_from(ns),
        speculative_method=ns.speculative_method, num_speculative_tokens=ns.num_speculative_tokens,
        speculative_draft_model=draft, speculative_max_batch=ns.speculative_max_batch,
        speculative_model=head_model_path(ns),
        **({} if ns.jump_forward is None else {"jump_forward": ns.jump_forward}),  # unset: EngineConfig reads the env
        **({} if ns.kv_cache_dtype is None else {"kv_cache_dtype": ns.kv_cache_dtype}),
        kv_events_endpoint=ns.kv_events_endpoint, kv_events_replay_endpoint=ns.kv_events_replay_endpoint,
        kv_events_topic=ns.kv_events_topic, kv_events_allow_remote=ns.kv_events_allow_remote,
        data_parallel_size=ns.data_parallel_size,
        enable_lora=ns.enable_lora or bool(ns.lora), max_loras=ns.max_loras, max_lora_rank=ns.max_lora_rank,
        lora_modules=tuple(ns.lora),
    )
    return ServerConfig(
        host=ns.host, port=ns.port, api_keys=keys, allow_unauthenticated=ns.allow_unauthenticated,
        cors_origins=tuple(ns.cors_origin), allowed_hosts=tuple(ns.allowed_host), keep_alive_s=ns.keep_alive,
        max_loaded_models=max(ns.max_loaded_models, len(preload)), preload=preload,
        home=str(home_dir(ns.home)), device=ns.device, dtype=ns.dtype, quantization=ns.quantization, engine=engine,
        stream_interval=ns.stream_interval, api_servers=ns.api_servers,
        allow_remote_images=ns.allow_remote_images,
    )


def lora_module(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"--lora: {text!r} is not NAME=PATH")
    return name.strip(), str(Path(path.strip()).expanduser().resolve())


def step_time_target_ms(text: str) -> int:
    from mlxr.config import MAX_STEP_TIME_TARGET_S

    value = int(text) if text.strip().isdecimal() else -1
    if not 0 <= value <= MAX_STEP_TIME_TARGET_S * 1000:
        raise argparse.ArgumentTypeError(f"--step-time-target-ms: {text!r} is not 0 to {MAX_STEP_TIME_TARGET_S * 1000:.0f}")
    return value


def max_tokens_default(text: str) -> int:
    value = int(text) if text.strip().isdecimal() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--max-tokens-default: {text!r} is not a whole number (0: no bound)")
    return value


def api_servers(text: str) -> int:
    from mlxr.config import MAX_API_SERVERS

    value = int(text) if str(text).strip().isdecimal() else 0
    if not 1 <= value <= MAX_API_SERVERS:
        raise argparse.ArgumentTypeError(f"--api-servers: {text!r} is not a whole number from 1 to {MAX_API_SERVERS}")
    return value


def stream_interval(text: str) -> int:
    from mlxr.config import MAX_STREAM_INTERVAL

    value = int(text) if text.strip().isdecimal() else 0
    if not 1 <= value <= MAX_STREAM_INTERVAL:
        raise argparse.ArgumentTypeError(f"--stream-interval: {text!r} is not a whole number from 1 to {MAX_STREAM_INTERVAL}")
    return value


def parse_duration(text: str) -> float:
    """"5m", "1h", "30s" or seconds; negative = forever (-1)."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--keep-alive: {text!r} is not a duration such as 5m, 1h or 30s")
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2) or "s"]
    return -1.0 if seconds < 0 else seconds


def head_model_path(ns: argparse.Namespace) -> str | None:
    """--speculative-model as an absolute path (the engine core may run in another process);
    mtp without one reads the served model's directory or GGUF file (its nextn layer)."""
    path = ns.speculative_model
    if path is None and ns.speculative_method == "mtp" and ns.model and _holds_mtp(Path(ns.model[0]).expanduser()):
        path = ns.model[0]
    if path is None:
        return None
    check_path_exists(path)
    return str(Path(path).expanduser().resolve())


def _holds_mtp(path: Path) -> bool:
    return path.is_dir() or (path.is_file() and path.suffix == ".gguf")


def draft_model_path(registry, ns: argparse.Namespace) -> str | None:
    """--draft-model as a path the loader reads (a registry name is resolved)."""
    if ns.draft_model is None:
        return None
    check_path_exists(ns.draft_model)
    path = Path(ns.draft_model).expanduser()
    return str(path) if path.exists() else str(registry.resolve(ns.draft_model).path)


def register_models(registry, models: list[str], mmproj: Path | None = None) -> tuple[str, ...]:
    """Registry names to preload: paths are imported first (with mmproj, the one model path with
    its projector, as llama-server's --mmproj); none given = the bundled models (the chat model
    and the base completion model)."""
    if mmproj is not None:
        if len(models) != 1 or not Path(models[0]).expanduser().is_file():
            raise ValueError("--mmproj goes with exactly one --model, a GGUF file's path")
        return (registry.import_model(Path(models[0]).expanduser(), projector=mmproj).name,)
    if not models:
        return tuple(r.name for r in registry.ensure_all_bundled())
    names = []
    for m in models:
        check_path_exists(m)
        path = Path(m).expanduser()
        names.append(registry.import_model(path).name if path.exists() else registry.resolve(m).name)
    return tuple(dict.fromkeys(names))


def cmd_serve(ns: argparse.Namespace) -> int:
    try:
        parallel = parallel_from(ns)
    except ValueError as e:
        return fail(str(e))
    if parallel.node_rank > 0:  # a further node of the tensor-parallel group: its workers only
        return run_node(parallel, ns.device or "cpu")
    try:
        keys = api_keys(ns)
    except (OSError, ValueError) as e:
        return fail(f"cannot read the API key: {e}")
    if not is_loopback(ns.host) and not keys and not ns.allow_unauthenticated:
        return fail(f"refusing to listen on {ns.host} without an API key: pass --api-key or "
                    "--api-key-file, or --allow-unauthenticated if you mean it")
    if (problem := port_problem(ns.host, ns.port) or kv_events_problem(ns)) is not None:
        return fail(problem)  # before any model loads: a second server fails in a moment
    from mlxr.registry import Registry
    from mlxr.server.logs import setup_logging

    setup_logging(_log_level(ns), ns.log_format)
    use_threads(ns)
    registry = Registry(home_dir(ns.home))
    try:
        config = server_config(ns, keys, register_models(registry, ns.model, ns.mmproj), draft_model_path(registry, ns))
    except (ValueError, MLXRError) as e:
        return fail(str(e))
    if config.api_servers > 1:
        if config.engine.enable_lora:
            return fail("LoRA adapters are served behind one API process for now: drop --api-servers")
        return _supervise(config, registry, ns)
    return run_server(config, registry, ns.shutdown_timeout, ns.log_stats_every, ns.max_tokens_default)


def _supervise(config, registry, ns: argparse.Namespace) -> int:
    from mlxr.server.supervisor import LogSettings, run_supervisor

    if config.engine.engine_process is False and config.engine.data_parallel_size == 1:  # replicas are processes
        return fail(f"--api-servers {config.api_servers} needs the engine core in its own process, "
                    "but MLXR_ENGINE_PROCESS=0 keeps it in this one: unset it or set it to 1")
    return run_supervisor(config, registry, ns.shutdown_timeout, ns.log_stats_every,
                          LogSettings(_log_level(ns), ns.log_format), ns.max_tokens_default)


def _log_level(ns: argparse.Namespace) -> str:
    # The global default (WARNING) would hide start-up and load lines; a daemon wants INFO.
    level = getattr(ns, "log_level", "INFO") or "INFO"
    return "INFO" if level.upper() == "WARNING" else level


def run_server(config, registry, shutdown_timeout: float, stats_every_s: float = 5.0,
               max_tokens: int = DEFAULT_MAX_TOKENS) -> int:
    import uvicorn

    from mlxr.server.app import create_app
    from mlxr.server.banner import print_banner

    app = create_app(config, registry, stats_every_s, max_tokens_default=max_tokens,
                     ready=lambda served: print_banner(config, served, max_tokens))
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown: stop accepting, let in-flight
    # requests (streams included) finish, then the app's lifespan shuts the engines down.
    uvicorn.run(app, host=config.host, port=config.port, log_config=None,
                timeout_graceful_shutdown=shutdown_timeout, access_log=False)
    return 0
