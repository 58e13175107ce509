"""Reading HF safetensors directories without torch: single, sharded, hostile, truncated."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.safetensors_dir import iter_safetensors, shard_files
from mlxr.testing.fixtures import bf16_bits_to_f32, f32_to_bf16_bits

pytestmark = pytest.mark.timeout(60)

_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I32": "int32", "F8_E4M3": "float8_e4m3fn"}


def save(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """tensors: name -> (safetensors dtype, array holding the stored bits)."""
    arrays = {k: np.ascontiguousarray(a) for k, (_, a) in tensors.items()}
    specs = {k: safetensors.TensorSpec(dtype=_DTYPES[d], shape=list(arrays[k].shape),
                                       data_ptr=arrays[k].ctypes.data, data_len=arrays[k].nbytes)
             for k, (d, _) in tensors.items()}
    safetensors.serialize_file(specs, str(path))


def sample() -> dict[str, tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {
        "a.weight": ("F32", rng.standard_normal((3, 4), dtype=np.float32)),
        "b.weight": ("F16", rng.standard_normal((5,)).astype(np.float16)),
        "c.weight": ("BF16", f32_to_bf16_bits(rng.standard_normal((2, 3, 4), dtype=np.float32))),
    }


def check_equal(got: dict, want: dict[str, tuple[str, np.ndarray]]) -> None:
    assert set(got) == set(want)
    for name, (dtype, array) in want.items():
        assert got[name].dtype == dtype
        np.testing.assert_array_equal(got[name].array, array)
        assert got[name].array.dtype == array.dtype


def test_single_file(tmp_path: Path) -> None:
    want = sample()
    save(tmp_path / "model.safetensors", want)
    got = {t.name: t for t in iter_safetensors(tmp_path)}
    check_equal(got, want)
    assert got["c.weight"].array.dtype == np.uint16
    assert bf16_bits_to_f32(got["c.weight"].array).dtype == np.float32


def write_sharded(root: Path, want: dict[str, tuple[str, np.ndarray]]) -> dict[str, str]:
    names = sorted(want)
    weight_map = {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}
    for shard in set(weight_map.values()):
        save(root / shard, {n: want[n] for n in names if weight_map[n] == shard})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_sharded(tmp_path: Path) -> None:
    want = sample()
    write_sharded(tmp_path, want)
    check_equal({t.name: t for t in iter_safetensors(tmp_path)}, want)
    assert [p.name for p in shard_files(tmp_path)] == ["model-00001-of-00002.safetensors",
                                                       "model-00002-of-00002.safetensors"]


@pytest.mark.parametrize("shard", ["../evil.safetensors", "/etc/passwd", "sub/x.safetensors",
                                   "..\\x.safetensors", "..", "", "x.bin", 7, None, "C:x.safetensors"])
def test_index_with_bad_shard_name_is_refused(tmp_path: Path, shard: object) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
    with pytest.raises(ModelFormatError):
        list(iter_safetensors(tmp_path))


def test_traversal_refused_even_when_target_exists(tmp_path: Path) -> None:
    inner = tmp_path / "model"
    inner.mkdir()
    save(tmp_path / "outside.safetensors", {"a": ("F32", np.zeros(2, np.float32))})
    (inner / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../outside.safetensors"}}))
    with pytest.raises(ModelFormatError, match="invalid shard"):
        list(iter_safetensors(inner))


@pytest.mark.parametrize("index", ["not json", "[]", '{"weight_map": []}', '{"weight_map": {}}', '{"other": 1}'])
def test_malformed_index(tmp_path: Path, index: str) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ModelFormatError):
        list(iter_safetensors(tmp_path))


def test_index_and_shards_must_agree(tmp_path: Path) -> None:
    want = sample()
    weight_map = write_sharded(tmp_path, want)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {**weight_map, "ghost": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(ModelFormatError, match="ghost"):
        list(iter_safetensors(tmp_path))
    index.write_text(json.dumps({"weight_map": {**weight_map, "x": "model-00003-of-00003.safetensors"}}))
    with pytest.raises(ModelFormatError, match="does not exist"):
        list(iter_safetensors(tmp_path))
    del weight_map["a.weight"]
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelFormatError, match="a.weight"):
        list(iter_safetensors(tmp_path))


def test_no_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError):
        list(iter_safetensors(tmp_path))


def test_every_truncation_is_a_format_error(tmp_path: Path) -> None:
    save(tmp_path / "full.safetensors", sample())
    data = (tmp_path / "full.safetensors").read_bytes()
    path = tmp_path / "model.safetensors"
    for cut in range(0, len(data), 3):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelFormatError):
            list(iter_safetensors(tmp_path))


@pytest.mark.parametrize("header", [b"{", b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]}}',
                                    b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}', b"[]"])
def test_corrupt_header(tmp_path: Path, header: bytes) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with pytest.raises(ModelFormatError):
        list(iter_safetensors(tmp_path))


def test_huge_header_length(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(ModelFormatError):
        list(iter_safetensors(tmp_path))


def test_unsupported_dtype(tmp_path: Path) -> None:
    save(tmp_path / "model.safetensors", {"a": ("F8_E4M3", np.zeros(4, np.uint8))})
    with pytest.raises(UnsupportedModelError):
        list(iter_safetensors(tmp_path))
