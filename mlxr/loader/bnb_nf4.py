"""bitsandbytes 4-bit (NF4) checkpoints, read without bitsandbytes and kept 4-bit.

A Linear4bit weight `X.weight` is saved as uint8 (two 4-bit codes a byte, the first in the high
nibble) beside `X.weight.absmax`, `X.weight.quant_map` (the 16-value code) and
`X.weight.quant_state.bitsandbytes__nf4` (JSON as uint8: quant_type, blocksize, dtype, shape,
and with double quantization nested_blocksize, nested_dtype, nested_offset, whose absmax is then
uint8 codes into `X.weight.nested_quant_map` scaled by `X.weight.nested_absmax`). Each weight
becomes an "NF4" PackedWeight (ops/quant/block_types.py): per 64 values the float32 absmax, computed
here as bitsandbytes does (code[q] * nested_absmax + offset), and the saved bytes unchanged.
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.safetensors_dir import RawTensor
from mlxr.layers.quant_linear import PackedWeight
from mlxr.ops.quant.reference_extra import NF4_VALUES

log = logging.getLogger(__name__)
BLOCK = 64  # the block size the NF4 kernels take
_STATE = ".quant_state.bitsandbytes__"
_MAX_STATE_BYTES = 64 << 10
_PARTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


def nf4_bases(names: Iterable[str]) -> set[str]:
    """The `X.weight` names saved in 4 bits."""
    bases = set()
    for name in names:
        base, sep, kind = name.partition(_STATE)
        if sep and kind != "nf4":
            raise UnsupportedModelError(f"{name}: bitsandbytes {kind.upper()} weights are not supported (NF4 is)")
        if sep:
            bases.add(base)
    return bases


def group_nf4(tensors: Iterator[RawTensor], bases: set[str]) -> Iterator[RawTensor | tuple[str, Any]]:
    """The checkpoint's tensors with each 4-bit weight's parts gathered into one
    (name, PackedWeight or dense tensor) item; other tensors pass through."""
    pending: dict[str, dict[str, RawTensor]] = {}
    for t in tensors:
        base = _base_of(t.name, bases)
        if base is None:
            yield t
            continue
        parts = pending.setdefault(base, {})
        parts[t.name[len(base):].lstrip(".")] = t
        if _complete(parts):
            yield base, _unpack(base, pending.pop(base))
    if pending:
        raise ModelFormatError(f"4-bit weight {next(iter(pending))!r} lacks parts of its quant state")


def _base_of(name: str, bases: set[str]) -> str | None:
    if name in bases:
        return name
    head, _, tail = name.rpartition(".weight.")
    base = head + ".weight"
    return base if head and base in bases and (tail in _PARTS or tail.startswith("quant_state.")) else None


def _complete(parts: dict[str, RawTensor]) -> bool:
    state = parts.get("quant_state.bitsandbytes__nf4")
    if state is None or "" not in parts or "absmax" not in parts or "quant_map" not in parts:
        return False
    return "nested_offset" not in _state(state) or ("nested_absmax" in parts and "nested_quant_map" in parts)


def _state(t: RawTensor) -> dict[str, Any]:
    if t.array.dtype != np.uint8 or t.array.size > _MAX_STATE_BYTES:
        raise ModelFormatError(f"{t.name} is not a bitsandbytes quant state")
    try:
        state = json.loads(t.array.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelFormatError(f"{t.name} is not valid JSON") from None
    if not isinstance(state, dict):
        raise ModelFormatError(f"{t.name} is not a JSON object")
    return state


def _unpack(base: str, parts: dict[str, RawTensor]) -> PackedWeight | torch.Tensor:
    state = _state(parts["quant_state.bitsandbytes__nf4"])
    shape = state.get("shape")
    if (state.get("quant_type") != "nf4" or not isinstance(shape, list) or len(shape) != 2
            or not all(isinstance(d, int) and 0 < d <= 1 << 20 for d in shape)):
        raise ModelFormatError(f"{base}: unsupported quant state {state}")
    n, k = shape
    if state.get("blocksize") != BLOCK:
        raise UnsupportedModelError(f"{base}: NF4 block size {state.get('blocksize')} (only {BLOCK} is supported)")
    codes = _array(parts[""], np.uint8, n * k // 2, base)
    code = _array(parts["quant_map"], np.float32, 16, f"{base}.quant_map")
    if not np.allclose(code, NF4_VALUES, atol=1e-6):
        raise UnsupportedModelError(f"{base}: its quant_map is not the NF4 code")
    absmax = _absmax(base, parts, state, math.ceil(n * k / BLOCK))
    if (n * k) % BLOCK or k % BLOCK:
        log.info("%s: rows of %d values do not split into blocks of %d; dequantized at load", base, k, BLOCK)
        return _dense(codes, absmax, n, k)
    blocks = np.concatenate([absmax.reshape(-1, 1).view(np.uint8), codes.reshape(-1, BLOCK // 2)], axis=1)
    return PackedWeight(torch.from_numpy(np.ascontiguousarray(blocks.reshape(n, -1))), "NF4", (n, k))


def _absmax(base: str, parts: dict[str, RawTensor], state: dict[str, Any], blocks: int) -> np.ndarray:
    if "nested_offset" not in state:
        return _array(parts["absmax"], np.float32, blocks, f"{base}.absmax")
    nested = state.get("nested_blocksize")
    if not isinstance(nested, int) or not 0 < nested <= 1 << 16:
        raise ModelFormatError(f"{base}: invalid nested_blocksize {nested!r}")
    q = _array(parts["absmax"], np.uint8, blocks, f"{base}.absmax")
    scale = _array(parts["nested_absmax"], np.float32, math.ceil(blocks / nested), f"{base}.nested_absmax")
    table = _array(parts["nested_quant_map"], np.float32, 256, f"{base}.nested_quant_map")
    per_block = np.repeat(scale, nested)[:blocks]
    return (table[q] * per_block + np.float32(state["nested_offset"])).astype(np.float32)


def _array(t: RawTensor, dtype: type, size: int, what: str) -> np.ndarray:
    if t.array.dtype != dtype or t.array.size != size:
        raise ModelFormatError(f"{what}: expected {size} values of {np.dtype(dtype).name}, got "
                               f"{t.array.size} of {t.array.dtype}")
    return np.ascontiguousarray(t.array).reshape(-1)


def _dense(codes: np.ndarray, absmax: np.ndarray, n: int, k: int) -> torch.Tensor:
    q = np.stack([codes >> 4, codes & 15], axis=-1).reshape(-1)
    values = np.asarray(NF4_VALUES, dtype=np.float32)[q] * np.repeat(absmax, BLOCK)[: n * k]
    return torch.from_numpy(values.reshape(n, k))
