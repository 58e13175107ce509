"""Options shared by several verbs, and what they resolve to (the data directory, a model path,
sampling parameters). Only the CLI and config.py read argv and the environment."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from mlxr.types import SamplingParams

DEFAULT_HOME = "~/.mlxr"


LOG_FORMATS = ("auto", "json", "human")  # mlxr.server.logs.LOG_FORMATS, without importing it


def add_log_format_option(p: argparse.ArgumentParser, default: object = "auto") -> None:
    p.add_argument("--log-format", choices=LOG_FORMATS, default=default,
                   help="auto: readable on a terminal, JSON lines otherwise")


def add_model_options(p: argparse.ArgumentParser, positional: bool) -> None:
    if positional:  # `mlxr run`: the bundled chat model
        p.add_argument("model", nargs="?", default="smollm2:135m")
    else:
        p.add_argument("--model", "-m", default="gemma3-270m")
    add_device_options(p)
    add_threads_option(p)


def add_device_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16")
    p.add_argument("--quantization", "-q", default=None,
                   help="auto (keep quantized GGUF weights) | none | fp8 (Hopper GPUs)")


def add_threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the model's math (default: $MLXR_NUM_THREADS, else chosen "
                        "from the CPUs this process may use)")


def num_threads(ns: argparse.Namespace) -> int:
    """--threads, else $MLXR_NUM_THREADS, else config.default_num_threads()."""
    from mlxr.config import default_num_threads
    from mlxr.errors import InvalidParameterError

    raw = ns.threads if getattr(ns, "threads", None) is not None else os.environ.get("MLXR_NUM_THREADS")
    if raw is None or raw == "":
        return default_num_threads(len(os.sched_getaffinity(0)))
    try:
        value = int(raw)
    except ValueError:
        raise InvalidParameterError("threads", f"MLXR_NUM_THREADS must be a whole number, got {raw!r}") from None
    if not 1 <= value <= 1024:
        raise InvalidParameterError("threads", f"must be between 1 and 1024, got {value}")
    return value


def use_threads(ns: argparse.Namespace) -> int:
    """Sets torch's intra-op threads for this process before any engine thread starts (a
    thread takes the count when it first runs parallel work)."""
    import torch

    n = num_threads(ns)
    torch.set_num_threads(n)
    return n


def add_sampling_options(p: argparse.ArgumentParser, default_max: int = 128) -> None:
    p.add_argument("--max-tokens", type=int, default=default_max)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def sampling_from(ns: argparse.Namespace) -> SamplingParams:
    return SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, top_k=ns.top_k,
                          top_p=ns.top_p, seed=ns.seed)


def home_dir(option: Path | str | None) -> Path:
    """--home, else $MLXR_HOME, else ~/.mlxr."""
    raw = option or os.environ.get("MLXR_HOME") or DEFAULT_HOME
    return Path(raw).expanduser().absolute()


_PATH_STARTS = ("/", "./", "../", "~", ".\\")
_MODEL_FILE_ENDS = (".gguf", ".safetensors", ".json")


def check_path_exists(ref: str) -> None:
    """A model written as a path (absolute, relative from a dot, from ~, or a model file's
    name) that is not on disk: ModelNotFoundError saying so, not "not a valid model name"."""
    from mlxr.errors import ModelNotFoundError

    looks_like_path = ref.startswith(_PATH_STARTS) or ref.lower().endswith(_MODEL_FILE_ENDS)
    if looks_like_path and not Path(ref).expanduser().exists():
        raise ModelNotFoundError(f"no such file or directory: {ref}")


def model_path(ref: str) -> str:
    """A registry name (`mlxr list`) becomes its path; paths and the bundled name pass through."""
    from mlxr.errors import ModelNotFoundError
    from mlxr.loader.resolve import BUNDLED_MODELS
    from mlxr.registry import Registry

    if ref in BUNDLED_MODELS or Path(ref).expanduser().exists():
        return ref
    check_path_exists(ref)
    try:
        return str(Registry(home_dir(None)).resolve(ref).path)
    except ModelNotFoundError:
        return ref  # the loader explains what it looked for
