"""A validated GGUF reader: every count, offset and size is checked against the file length.

The header is parsed here rather than with `gguf.GGUFReader`, because GGUFReader trusts the
file's counts (a huge array length makes it loop or allocate without bound) and takes ~10 s
on a 262k-token vocabulary. Tensor bytes become float32 in gguf_types.py.
"""
from __future__ import annotations

import math
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.gguf_types import to_float32

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_ALIGNMENT = 1 << 20
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NAME_BYTES = 1024
_MAX_ELEMENTS = 1 << 48
_MAX_ARRAY_DEPTH = 2
# Smallest possible encodings, used to bound counts by the bytes that are left.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-byte key, value type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name, n_dims, one dim, type, offset
_HEADER_BYTES = 4 + 4 + 8 + 8

_SCALAR_DTYPES: dict[int, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
_MIN_ELEMENT_BYTES = {
    **{t: d.itemsize for t, d in _SCALAR_DTYPES.items()},
    GGUFValueType.STRING: 8,
    GGUFValueType.ARRAY: 4 + 8,
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor's header entry. `shape` is in numpy/torch order (ggml dims reversed);
    `offset` is the absolute position of its first byte in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    n_bytes: int
    offset: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class _Cursor:
    """Reads little-endian values from a file, refusing to read past its (known) end.

    Plain reads rather than an mmap: a file truncated while we read it gives a short read,
    which we report, instead of a SIGBUS."""

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh = fh
        self.size = size
        self.pos = 0

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.remaining():
            raise ModelFormatError(
                f"GGUF file is truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"only {self.remaining()} remain"
            )
        data = self.fh.read(n)
        if len(data) != n:
            raise ModelFormatError(f"GGUF file shrank while reading {what} at offset {self.pos}")
        self.pos += n
        return data

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str, max_bytes: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if max_bytes is not None and n > max_bytes:
            raise ModelFormatError(f"GGUF {what} is {n} bytes long (limit {max_bytes})")
        raw = self.take(n, what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise ModelFormatError(f"GGUF {what} is not valid UTF-8: {e}") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            return self.array(what, depth)
        dtype = _SCALAR_DTYPES.get(vtype)
        if dtype is None:
            raise ModelFormatError(f"GGUF {what} has unknown value type {vtype}")
        item = np.frombuffer(self.take(dtype.itemsize, what), dtype=dtype)[0]
        return bool(item) if vtype == GGUFValueType.BOOL else item.item()

    def array(self, what: str, depth: int) -> list[Any]:
        if depth >= _MAX_ARRAY_DEPTH:
            raise ModelFormatError(f"GGUF {what} nests arrays deeper than {_MAX_ARRAY_DEPTH}")
        itype = self.u32(f"element type of {what}")
        count = self.u64(f"length of {what}")
        min_bytes = _MIN_ELEMENT_BYTES.get(itype)
        if min_bytes is None:
            raise ModelFormatError(f"GGUF {what} has unknown element type {itype}")
        if count * min_bytes > self.remaining():
            raise ModelFormatError(
                f"GGUF {what} claims {count} elements, more than the {self.remaining()} "
                "bytes left in the file can hold"
            )
        dtype = _SCALAR_DTYPES.get(itype)
        if dtype is not None:
            items = np.frombuffer(self.take(count * dtype.itemsize, what), dtype=dtype)
            return items.astype(bool).tolist() if itype == GGUFValueType.BOOL else items.tolist()
        return [self.value(itype, what, depth + 1) for _ in range(count)]


@dataclass
class _Header:
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, int]
    alignment: int
    data_offset: int
    tensors: dict[str, GGUFTensorInfo]


def _parse_header(fh: BinaryIO, size: int) -> _Header:
    cur = _Cursor(fh, size)
    if bytes(cur.take(4, "magic")) != _MAGIC:
        raise ModelFormatError("not a GGUF file (bad magic)")
    version = _check_version(cur.u32("version"))
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > cur.remaining():
        raise ModelFormatError(
            f"GGUF header claims {n_tensors} tensors and {n_kv} metadata entries, "
            f"more than a file of {size} bytes can hold"
        )
    metadata, value_types = _read_metadata(cur, n_kv)
    alignment = _alignment(metadata, value_types)
    raw_infos = [_read_tensor_info(cur, i) for i in range(n_tensors)]
    data_offset = _align(cur.pos, alignment)
    tensors = _validate_tensors(raw_infos, data_offset, alignment, size)
    return _Header(version, metadata, value_types, alignment, data_offset, tensors)


def _check_version(version: int) -> int:
    if version in _VERSIONS:
        return version
    if version & 0xFFFF == 0 and (version >> 24) in _VERSIONS:
        raise UnsupportedModelError("big-endian GGUF files are not supported")
    if version == 1:
        raise UnsupportedModelError("GGUF version 1 is not supported (only 2 and 3)")
    raise ModelFormatError(f"GGUF version {version} is invalid (expected 2 or 3)")


def _read_metadata(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, int]]:
    metadata: dict[str, Any] = {}
    value_types: dict[str, int] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", _MAX_NAME_BYTES)
        if key in metadata:
            raise ModelFormatError(f"GGUF metadata key {key!r} appears twice")
        vtype = cur.u32(f"value type of {key!r}")
        metadata[key] = cur.value(vtype, f"metadata value {key!r}")
        value_types[key] = vtype
    return metadata, value_types


def _alignment(metadata: dict[str, Any], value_types: dict[str, int]) -> int:
    if "general.alignment" not in metadata:
        return _DEFAULT_ALIGNMENT
    value = metadata["general.alignment"]
    if value_types["general.alignment"] != GGUFValueType.UINT32:
        raise ModelFormatError("GGUF general.alignment must be a uint32")
    if value <= 0 or value & (value - 1) or value > _MAX_ALIGNMENT:
        raise ModelFormatError(f"GGUF general.alignment {value} is not a power of two <= 2**20")
    return value


def _align(pos: int, alignment: int) -> int:
    return (pos + alignment - 1) // alignment * alignment


def _read_tensor_info(cur: _Cursor, index: int) -> tuple[str, list[int], int, int]:
    name = cur.string(f"name of tensor #{index}", _MAX_NAME_BYTES)
    if not name:
        raise ModelFormatError(f"GGUF tensor #{index} has an empty name")
    n_dims = cur.u32(f"dimension count of {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise ModelFormatError(f"GGUF tensor {name!r} has {n_dims} dimensions (1..{_MAX_DIMS})")
    dims = [cur.u64(f"dimensions of {name!r}") for _ in range(n_dims)]
    type_id = cur.u32(f"type of {name!r}")
    offset = cur.u64(f"data offset of {name!r}")
    return name, dims, type_id, offset


def _validate_tensors(
    raw_infos: list[tuple[str, list[int], int, int]], data_offset: int, alignment: int, size: int
) -> dict[str, GGUFTensorInfo]:
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, dims, type_id, rel_offset in raw_infos:
        if name in tensors:
            raise ModelFormatError(f"GGUF tensor name {name!r} appears twice")
        tensors[name] = _tensor_info(name, dims, type_id, rel_offset, data_offset, alignment, size)
    _check_no_overlap(list(tensors.values()))
    return tensors


def _tensor_info(
    name: str, dims: list[int], type_id: int, rel_offset: int, data_offset: int,
    alignment: int, size: int,
) -> GGUFTensorInfo:
    qtype = _ggml_type(name, type_id)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if any(d == 0 for d in dims):
        raise ModelFormatError(f"GGUF tensor {name!r} has a zero dimension {dims}")
    n_elements = math.prod(dims)
    if n_elements > _MAX_ELEMENTS:
        raise ModelFormatError(f"GGUF tensor {name!r} has an implausible shape {dims}")
    if dims[0] % block_size:
        raise ModelFormatError(
            f"GGUF tensor {name!r}: row length {dims[0]} is not a multiple of the "
            f"{qtype.name} block size {block_size}"
        )
    n_bytes = n_elements // block_size * type_size
    if rel_offset % alignment:
        raise ModelFormatError(
            f"GGUF tensor {name!r}: data offset {rel_offset} is not aligned to {alignment}"
        )
    start = data_offset + rel_offset
    if start + n_bytes > size:
        raise ModelFormatError(
            f"GGUF tensor {name!r}: bytes [{start}, {start + n_bytes}) lie outside the "
            f"file of {size} bytes"
        )
    return GGUFTensorInfo(name, tuple(reversed(dims)), qtype.name, n_bytes, start)


def _ggml_type(name: str, type_id: int) -> GGMLQuantizationType:
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise UnsupportedModelError(f"GGUF tensor {name!r} has unknown ggml type id {type_id}") from None
    if qtype not in GGML_QUANT_SIZES:
        raise UnsupportedModelError(f"GGUF tensor {name!r} has unsupported type {qtype.name}")
    return qtype


def _check_no_overlap(infos: list[GGUFTensorInfo]) -> None:
    ordered = sorted(infos, key=lambda t: t.offset)
    for prev, cur in zip(ordered, ordered[1:]):
        if cur.offset < prev.offset + prev.n_bytes:
            raise ModelFormatError(f"GGUF tensors {prev.name!r} and {cur.name!r} overlap")


class GGUFFile:
    """An open, validated GGUF file. Use `open_gguf(path)`; close it or use it as a context."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file_size = _file_size(path)
        self._lock = threading.Lock()
        try:
            self._file: BinaryIO | None = open(path, "rb", buffering=1 << 20)
        except OSError as e:
            raise ModelFormatError(f"cannot open GGUF file {path}: {e.strerror}") from None
        try:
            header = _parse_header(self._file, self.file_size)
        except BaseException:
            self.close()
            raise
        self.version = header.version
        self.metadata: dict[str, Any] = header.metadata
        self.value_types = header.value_types
        self.alignment = header.alignment
        self.data_offset = header.data_offset
        self._tensors = header.tensors

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelFormatError("GGUF file has no general.architecture string")
        return arch

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def tensor_info(self, name: str) -> GGUFTensorInfo:
        info = self._tensors.get(name)
        if info is None:
            raise ModelFormatError(f"GGUF file {self.path.name} has no tensor {name!r}")
        return info

    def load_raw(self, name: str) -> tuple[np.ndarray, str]:
        """The tensor's bytes as stored (uint8, shape (*rows, bytes_per_row)) and its type name."""
        info = self.tensor_info(name)
        qtype = GGMLQuantizationType[info.ggml_type]
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        byte_shape = (*info.shape[:-1], info.shape[-1] // block_size * type_size)
        return self._read(info).reshape(byte_shape), info.ggml_type

    def load(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, in numpy/torch shape order."""
        raw, type_name = self.load_raw(name)
        return to_float32(name, raw, type_name, self._tensors[name].shape)

    def _read(self, info: GGUFTensorInfo) -> np.ndarray:
        buf = bytearray(info.n_bytes)
        with self._lock:
            if self._file is None:
                raise ValueError("GGUF file is closed")
            self._file.seek(info.offset)
            got = self._file.readinto(buf)
        if got != info.n_bytes:
            raise ModelFormatError(f"GGUF file {self.path.name} shrank while reading tensor {info.name!r}")
        return np.frombuffer(buf, dtype=np.uint8)

    def close(self) -> None:
        fh, self._file = getattr(self, "_file", None), None
        if fh is not None:
            fh.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _file_size(path: Path) -> int:
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise ModelFormatError(f"cannot read GGUF file {path}: {e.strerror}") from None
    if size < _HEADER_BYTES:
        raise ModelFormatError(f"GGUF file {path} is too small ({size} bytes) to be GGUF")
    return size


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open and validate a GGUF file. Raises ModelFormatError or UnsupportedModelError."""
    return GGUFFile(Path(path))
