"""Caps on the sizes a model file declares, checked as its config is read and before anything
is built from them: a layer count of 100,000 once built 100,000 modules, and 2**62-wide
layers reached torch as untyped errors. The caps are far above any published model."""
from __future__ import annotations

import re
from collections.abc import Iterable

from mlxr.errors import ModelFormatError
from mlxr.model_config import ModelArgs

MAX_LAYERS = 1024  # the largest published models have under 200
MAX_WIDTH = 1 << 20  # hidden and intermediate sizes, head counts, head_dim
MAX_VOCAB = 1 << 22
MAX_CONTEXT = 1 << 24

_WIDTHS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")


def check_layer_count(layers: int, key: str) -> int:
    if layers > MAX_LAYERS:
        raise ModelFormatError(f"{key} is {layers}: more than {MAX_LAYERS} layers")
    return layers


def check_sizes(args: ModelArgs, where: str) -> ModelArgs:
    check_layer_count(args.num_hidden_layers, f"{where} layer count")
    for name in _WIDTHS:
        _at_most(getattr(args, name), MAX_WIDTH, f"{where} {name}")
    _at_most(args.vocab_size, MAX_VOCAB, f"{where} vocab_size")
    _at_most(args.max_position_embeddings, MAX_CONTEXT, f"{where} context length")
    if args.sliding_window is not None:
        _at_most(args.sliding_window, MAX_CONTEXT, f"{where} sliding_window")
    return args


def _at_most(value: int, limit: int, what: str) -> None:
    if value > limit:
        raise ModelFormatError(f"{what} is {value}, more than {limit}")


def check_layers_present(declared: int, names: Iterable[str], prefix: str, source: str) -> None:
    """The layer count must match the layers the file holds tensors for (`prefix` + N + ".")."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    present = {int(m.group(1)) for name in names if (m := pattern.match(name))}
    if present != set(range(declared)):
        found = f"{len(present)} (numbered {min(present)} to {max(present)})" if present else "none"
        stray = sorted(present - set(range(declared)))[:3]
        extra = f"; tensors of {', '.join(f'layer {n}' for n in stray)} have no place" if stray else ""
        raise ModelFormatError(f"{source} declares {declared} layers but holds tensors for {found}{extra}")
