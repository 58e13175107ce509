"""Read a Hugging Face model directory's weights with the safetensors library, without torch.

numpy has no bfloat16, so BF16 tensors come back as their raw bits (uint16, dtype "BF16");
the safetensors library validates each file's header and offsets before we read its bytes.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.json_file import read_json_object

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_MAX_INDEX_BYTES = 64 << 20
_MAX_HEADER_BYTES = 100 << 20
_NUMPY_DTYPES = frozenset({"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "BOOL"})


@dataclass(frozen=True)
class RawTensor:
    """One checkpoint tensor: BF16 as uint16 bits, other dtypes as the matching numpy array."""

    name: str
    array: np.ndarray
    dtype: str  # safetensors dtype name: "F32" | "F16" | "BF16" | ...


def shard_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of a model directory, validated, in load order."""
    root = Path(model_dir)
    if (root / INDEX_FILE).is_file():
        return [root / name for name in _index(root)]
    if (root / SINGLE_FILE).is_file():
        return [root / SINGLE_FILE]
    raise ModelFormatError(f"{root} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def tensor_names(model_dir: str | os.PathLike[str]) -> list[str]:
    """Every tensor name of the checkpoint, from the headers alone (no tensor data read)."""
    try:
        return [name for path in shard_files(model_dir) for name in _header_offsets(path)]
    except OSError as e:
        raise ModelFormatError(f"cannot read the checkpoint of {model_dir}: {e.strerror}") from None


def iter_safetensors(model_dir: str | os.PathLike[str]) -> Iterator[RawTensor]:
    """Yield every tensor of the directory's checkpoint, one at a time."""
    root = Path(model_dir)
    index_path = root / INDEX_FILE
    weight_map = _index(root) if index_path.is_file() else None
    seen: set[str] = set()
    for path in shard_files(root):
        expected = None if weight_map is None else weight_map[path.name]
        for tensor in _iter_file(path, expected):
            if tensor.name in seen:
                raise ModelFormatError(f"tensor {tensor.name!r} appears in more than one shard")
            seen.add(tensor.name)
            yield tensor


def iter_safetensors_file(path: Path) -> Iterator[RawTensor]:
    """Every tensor of one safetensors file (a LoRA adapter's), validated as a shard is."""
    return _iter_file(Path(path), None)


def _index(root: Path) -> dict[str, set[str]]:
    """shard file name -> tensor names, from a validated model.safetensors.index.json."""
    index = read_json_object(root / INDEX_FILE, _MAX_INDEX_BYTES)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFormatError(f"{INDEX_FILE} has no weight_map object")
    shards: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        _check_shard_name(shard)
        shards.setdefault(shard, set()).add(tensor)
    for shard in shards:
        if not (root / shard).is_file():
            raise ModelFormatError(f"{INDEX_FILE} names shard {shard!r}, which does not exist")
    return dict(sorted(shards.items()))


def _check_shard_name(shard: object) -> None:
    """A shard must be a plain file name inside the model directory (no path traversal)."""
    if (
        not isinstance(shard, str)
        or not shard
        or shard in (".", "..")
        or "/" in shard
        or "\\" in shard
        or "\0" in shard
        or ":" in shard
        or os.path.basename(shard) != shard
        or not shard.endswith(".safetensors")
    ):
        raise ModelFormatError(f"{INDEX_FILE} names an invalid shard file {shard!r}")


def _iter_file(path: Path, expected: set[str] | None) -> Iterator[RawTensor]:
    try:
        offsets = _header_offsets(path)
        with safe_open(path, framework="numpy") as f:
            names = list(f.keys())
            _check_names(path, names, expected)
            for name in names:
                yield _read(f, path, name, offsets)
    except SafetensorError as e:
        raise ModelFormatError(f"{path.name} is not a valid safetensors file: {e}") from None
    except OSError as e:
        raise ModelFormatError(f"cannot read {path.name}: {e.strerror}") from None


def _check_names(path: Path, names: list[str], expected: set[str] | None) -> None:
    if expected is None:
        return
    missing = sorted(expected - set(names))
    if missing:
        raise ModelFormatError(f"{path.name} lacks tensors its index names: {', '.join(missing[:5])}")
    extra = sorted(set(names) - expected)
    if extra:
        raise ModelFormatError(f"{path.name} holds tensors its index does not name: {', '.join(extra[:5])}")


def _read(f, path: Path, name: str, offsets: dict[str, tuple[int, int]]) -> RawTensor:
    sl = f.get_slice(name)
    dtype, shape = sl.get_dtype(), tuple(sl.get_shape())
    if dtype == "BF16":
        return RawTensor(name, _read_bf16(path, offsets[name], shape), "BF16")
    if dtype not in _NUMPY_DTYPES:
        raise UnsupportedModelError(f"tensor {name!r} in {path.name} has unsupported dtype {dtype}")
    array = f.get_tensor(name)
    if array.shape != shape:
        raise ModelFormatError(f"tensor {name!r} in {path.name} has an inconsistent shape")
    return RawTensor(name, array, dtype)


def _header_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """Absolute byte ranges of each tensor; safe_open has checked the same header's ranges."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelFormatError(f"{path.name} is truncated (no header)")
        n = struct.unpack("<Q", head)[0]
        if n > min(size - 8, _MAX_HEADER_BYTES):
            raise ModelFormatError(f"{path.name}: header length {n} exceeds the file")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFormatError(f"{path.name}: header is not valid JSON: {e}") from None
        except RecursionError:
            raise ModelFormatError(f"{path.name}: header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path.name}: header is not a JSON object")
    offsets: dict[str, tuple[int, int]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        span = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)):
            raise ModelFormatError(f"{path.name}: tensor {name!r} has no valid data_offsets")
        start, end = 8 + n + span[0], 8 + n + span[1]
        if not 8 + n <= start <= end <= size:
            raise ModelFormatError(f"{path.name}: tensor {name!r} lies outside the file")
        offsets[name] = (start, end)
    return offsets


def _read_bf16(path: Path, span: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    start, end = span
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if end - start != 2 * count:
        raise ModelFormatError(f"{path.name}: BF16 tensor byte length does not match its shape {shape}")
    with open(path, "rb") as fh:
        fh.seek(start)
        data = np.fromfile(fh, dtype="<u2", count=count)
    if data.size != count:
        raise ModelFormatError(f"{path.name} is truncated")
    return data.reshape(shape)
