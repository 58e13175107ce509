"""Ollama `options` -> SamplingParams.

Defaults are Ollama's (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1), not the
engine's. The context is fixed when a model loads, so num_ctx can only shrink the window a
request may use; a larger value is clamped with a log line. Keys that change how the model is
loaded or that we do not implement are accepted and ignored with a log line. num_thread sets the
CPU threads of the loaded model from the request on (routes.py), as Ollama sets its runner's.
"""
from __future__ import annotations

import logging

from typing import Annotated

from pydantic import BeforeValidator, ConfigDict

from mlxr.errors import ContextLengthError, InvalidParameterError
from mlxr.loader.sampling_defaults import SamplingDefaults
from mlxr.server.text_fields import CheckedText
from mlxr.types import SamplingParams

log = logging.getLogger(__name__)

DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1}
_OURS_TO_OLLAMA = {
    "max_tokens": "num_predict", "repetition_penalty": "repeat_penalty", "temperature": "temperature",
    "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed", "stop": "stop",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
}
_IGNORED = ("num_batch", "num_gpu", "main_gpu", "numa", "low_vram", "f16_kv",
            "use_mmap", "use_mlock", "vocab_only", "logits_all", "embedding_only", "num_keep",
            "typical_p", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta", "penalize_newline")


def _whole_number(value: object) -> object:
    """2048.0 -> 2048: JSON has one number type, and Ollama takes any number for an integer
    option (Python clients send computed values as floats); a fraction stays a 400."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_whole_number)]


class Options(CheckedText):
    """Ollama's runtime options. Types are strict (a string temperature is a 400; an integer
    option takes a whole number written as a float); keys outside this list are ignored with a
    log line."""

    model_config = ConfigDict(strict=True, extra="allow")

    num_ctx: Int | None = None
    num_predict: Int | None = None
    seed: Int | None = None
    temperature: float | None = None
    top_k: Int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: Int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | str | None = None
    num_batch: Int | None = None
    num_thread: Int | None = None
    num_gpu: Int | None = None
    main_gpu: Int | None = None
    num_keep: Int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: Int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    vocab_only: bool | None = None
    logits_all: bool | None = None
    embedding_only: bool | None = None


MAX_THREADS = 1024


def num_threads(options: Options | None) -> int | None:
    """The CPU threads a request asks for (Ollama's num_thread; 0 or absent: the default)."""
    n = options.num_thread if options else None
    if n is not None and not 0 <= n <= MAX_THREADS:
        raise InvalidParameterError("options.num_thread", f"must be from 0 (the default) to {MAX_THREADS}, got {n}")
    return n or None


def log_ignored(options: Options | None) -> None:
    if options is None:
        return
    for key in _IGNORED:
        if getattr(options, key) is not None:
            log.info("ollama option %s=%r is accepted and ignored", key, getattr(options, key))
    for key in options.model_extra or {}:
        log.info("unknown ollama option %r ignored", key)
    if options.repeat_last_n not in (None, 64):
        log.info("repeat_last_n=%d ignored: repeat_penalty applies to the whole context", options.repeat_last_n)


def context_window(options: Options | None, context_length: int) -> int:
    """The tokens a request may use: the model's context, or less when num_ctx asks."""
    num_ctx = options.num_ctx if options else None
    if num_ctx is None:
        return context_length
    if num_ctx < 1:
        raise InvalidParameterError("options.num_ctx", f"must be positive, got {num_ctx}")
    if num_ctx > context_length:
        log.info("num_ctx %d clamped to the loaded context length %d", num_ctx, context_length)
        return context_length
    return num_ctx


def max_tokens(options: Options | None, prompt_tokens: int, window: int, prompt_field: str,
               default: int = 0) -> int:
    """num_predict as a token budget: -1 and -2 fill the window; larger values are clamped
    to what is left of the window (the request then ends with done_reason "length"). Unset:
    `default` (--max-tokens-default; 0: the window) within what is left."""
    if prompt_tokens >= window:
        raise ContextLengthError(prompt_tokens, window, param=prompt_field)
    room = window - prompt_tokens
    wanted = options.num_predict if options else None
    if wanted is None and default > 0:
        return min(default, room)
    if wanted is None or wanted in (-1, -2):
        return room
    if wanted < 1:
        raise InvalidParameterError(
            "options.num_predict", f"must be positive, -1 (until the context is full) or -2, got {wanted}"
        )
    return min(wanted, room)


def sampling_params(options: Options | None, budget: int, model: SamplingDefaults | None = None) -> SamplingParams:
    """Raises InvalidParameterError naming the Ollama option (options.<key>). An option the
    request leaves out takes the model's default (its files, preset or Modelfile), else Ollama's."""
    o = options or Options()
    fallback = {**DEFAULTS, **(model.values if model else {})}
    pick = lambda key: fallback.get(key) if getattr(o, key) is None else getattr(o, key)  # noqa: E731
    seed = None if o.seed is None or o.seed == -1 else o.seed  # Ollama: -1 = random
    try:
        return SamplingParams(
            max_tokens=budget, temperature=pick("temperature"), top_k=pick("top_k"),
            top_p=pick("top_p"), min_p=pick("min_p") or 0.0, repetition_penalty=pick("repeat_penalty"),
            presence_penalty=o.presence_penalty or 0.0, frequency_penalty=o.frequency_penalty or 0.0,
            seed=seed, stop=o.stop,
        )
    except InvalidParameterError as e:
        name = _OURS_TO_OLLAMA.get(e.param or "", e.param)
        raise InvalidParameterError(f"options.{name}", e.message.removeprefix(f"{e.param}: ")) from None
