"""The GGUF reader: hostile and corrupted files fail cleanly; dequantization matches gguf-py."""
from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from mlxr.errors import MLXRError, ModelFormatError, UnsupportedModelError
from mlxr.formats.gguf import open_gguf

pytestmark = pytest.mark.timeout(60)

T = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType


# ---- a raw GGUF builder, so every field can be made hostile ------------------------------


def _str(s: str | bytes, length: int | None = None) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", vtype) + payload


def _ti(name: str, dims: list[int], type_id: int, offset: int, n_dims: int | None = None) -> bytes:
    out = _str(name) + struct.pack("<I", len(dims) if n_dims is None else n_dims)
    out += b"".join(struct.pack("<Q", d) for d in dims)
    return out + struct.pack("<IQ", type_id, offset)


def build(
    kvs: list[bytes] | None = None,
    tensors: list[bytes] | None = None,
    data: bytes = b"",
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
) -> bytes:
    kvs = [_kv("general.architecture", T.STRING, _str("llama"))] if kvs is None else kvs
    tensors = tensors or []
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(tensors)
    head += b"\0" * (-len(head) % alignment)
    return head + data


def one_tensor(name: str = "w", dims: tuple[int, ...] = (8, 2), type_id: int = Q.F32, offset: int = 0,
               extra_kvs: list[bytes] | None = None, **kw: object) -> bytes:
    n = int(np.prod(dims)) * 4
    kvs = [_kv("general.architecture", T.STRING, _str("llama"))] + (extra_kvs or [])
    return build(kvs, [_ti(name, list(dims), type_id, offset)], np.arange(n // 4, dtype="<f4").tobytes(), **kw)


def _write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _fails(tmp_path: Path, data: bytes, err: type[Exception] = ModelFormatError) -> str:
    with pytest.raises(err) as info:
        open_gguf(_write(tmp_path, data)).close()
    return str(info.value)


def test_builder_makes_a_valid_file(tmp_path: Path) -> None:
    with open_gguf(_write(tmp_path, one_tensor())) as f:
        assert f.architecture == "llama"
        assert f.tensor_info("w").shape == (2, 8)
        np.testing.assert_array_equal(f.load("w"), np.arange(16, dtype=np.float32).reshape(2, 8))


HOSTILE = [
    (b"GGUX" + b"\0" * 40, "magic"),
    (build(version=4), "version"),
    (build(version=0), "version"),
    (build(n_tensors=2**60), "tensors"),
    (build(n_kv=2**60), "metadata"),
    (build(n_kv=2**64 - 1), "metadata"),
    (build([_kv("general.name", T.STRING, _str("x", length=2**62))]), "truncated"),
    (build([_str("k", length=2**40) + b"x"]), "long"),
    (build([_kv("a", T.ARRAY, struct.pack("<IQ", T.UINT8, 2**62))]), "elements"),
    (build([_kv("a", T.ARRAY, struct.pack("<IQ", T.STRING, 2**40))]), "elements"),
    (build([_kv("a", T.ARRAY, struct.pack("<IQ", T.ARRAY, 1) + struct.pack("<IQ", T.ARRAY, 1)
                + struct.pack("<IQ", T.UINT8, 1) + b"\1")]), "nests"),
    (build([_kv("a", 99, b"\0" * 8)]), "value type"),
    (build([_kv("a", T.ARRAY, struct.pack("<IQ", 77, 1) + b"\0" * 8)]), "element type"),
    (build([_kv("a", T.UINT8, b"\1"), _kv("a", T.UINT8, b"\1")]), "twice"),
    (build([_str(b"\xff\xfe") + struct.pack("<I", T.UINT8) + b"\1"]), "UTF-8"),
    (build([_kv("general.alignment", T.UINT32, struct.pack("<I", 3))]), "alignment"),
    (build([_kv("general.alignment", T.UINT32, struct.pack("<I", 0))]), "alignment"),
    (build([_kv("general.alignment", T.UINT64, struct.pack("<Q", 32))]), "alignment"),
    (one_tensor(offset=64), "outside"),
    (one_tensor(offset=2**63), "outside"),
    (one_tensor(offset=4), "aligned"),
    (one_tensor(dims=(2**32, 2**32, 2**32)), "implausible"),
    (one_tensor(dims=(8, 0)), "zero"),
    (build(tensors=[_ti("w", [8], Q.F32, 0, n_dims=2**31)]), "dimensions"),
    (build(tensors=[_ti("w", [8], Q.F32, 0, n_dims=0)]), "dimensions"),
    (build(tensors=[_ti("", [8], Q.F32, 0)], data=b"\0" * 32), "empty name"),
    (build(tensors=[_ti("w", [8], Q.F32, 0), _ti("w", [8], Q.F32, 32)], data=b"\0" * 64), "twice"),
    (build(tensors=[_ti("a", [16], Q.F32, 0), _ti("b", [8], Q.F32, 32)], data=b"\0" * 64), "overlap"),
    (build(tensors=[_ti("w", [33], Q.Q8_0, 0)], data=b"\0" * 64), "block size"),
]


@pytest.mark.parametrize("data, fragment", HOSTILE, ids=[f"{i}-{f}" for i, (_, f) in enumerate(HOSTILE)])
def test_hostile_header_is_a_format_error(tmp_path: Path, data: bytes, fragment: str) -> None:
    assert fragment.lower() in _fails(tmp_path, data).lower()


@pytest.mark.parametrize("data", [build(version=1), build(version=3 << 24), one_tensor(type_id=9999),
                                  one_tensor(type_id=31)])
def test_unsupported_versions_and_types(tmp_path: Path, data: bytes) -> None:
    _fails(tmp_path, data, UnsupportedModelError)


def test_undequantizable_type_is_unsupported_on_load(tmp_path: Path) -> None:
    # Q8_K is an activation type: gguf-py cannot dequantize it (integer types now load).
    data = build(tensors=[_ti("w", [256], Q.Q8_K, 0)], data=b"\0" * 292)
    with open_gguf(_write(tmp_path, data)) as f:
        assert f.load_raw("w")[1] == "Q8_K"
        with pytest.raises(UnsupportedModelError):
            f.load("w")


def test_file_truncated_after_open(tmp_path: Path) -> None:
    path = _write(tmp_path, one_tensor(dims=(1024, 1024)))  # larger than the read buffer
    with open_gguf(path) as f:
        with open(path, "r+b") as fh:
            fh.truncate(f.data_offset + 8)
        with pytest.raises(ModelFormatError, match="shrank"):
            f.load("w")


def test_missing_and_empty_files(tmp_path: Path) -> None:
    _fails(tmp_path, b"")
    with pytest.raises(ModelFormatError):
        open_gguf(tmp_path / "absent.gguf")
    with pytest.raises(ModelFormatError):
        open_gguf(tmp_path)


def _writer_file(tmp_path: Path) -> bytes:
    w = gguf.GGUFWriter(str(tmp_path / "w.gguf"), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_array("tokenizer.ggml.tokens", ["a", "bé", "🙂"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    rng = np.random.default_rng(0)
    w.add_tensor("a", rng.standard_normal((4, 64), dtype=np.float32))
    q = gguf.quants.quantize(rng.standard_normal((2, 64), dtype=np.float32), Q.Q8_0)
    w.add_tensor("b", q, raw_dtype=Q.Q8_0)
    w.add_tensor("c", rng.standard_normal((32,), dtype=np.float32).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return (tmp_path / "w.gguf").read_bytes()


def test_every_truncation_is_a_format_error(tmp_path: Path) -> None:
    data = _writer_file(tmp_path)
    with open_gguf(_write(tmp_path, data, "full.gguf")) as f:
        end = max(i.offset + i.n_bytes for i in (f.tensor_info(n) for n in f.tensor_names))
        assert f.metadata["tokenizer.ggml.tokens"] == ["a", "bé", "🙂"]
    with open_gguf(_write(tmp_path, data, "full.gguf")) as f:
        header_end = f.data_offset
    for cut in [*range(0, header_end), *range(header_end, end, 5), end - 1]:
        with pytest.raises(ModelFormatError):
            open_gguf(_write(tmp_path, data[:cut])).close()


def test_flipped_header_bytes_never_leak_other_errors(tmp_path: Path) -> None:
    data = bytearray(_writer_file(tmp_path))
    with open_gguf(_write(tmp_path, bytes(data), "full.gguf")) as f:
        header_end = f.data_offset
    for pos in range(header_end):
        for mask in (0xFF, 0x01, 0x80):
            bad = bytearray(data)
            bad[pos] ^= mask
            try:
                with open_gguf(_write(tmp_path, bytes(bad))) as f:
                    for name in f.tensor_names:
                        f.load(name)
            except MLXRError:
                pass


def _k_quant_blocks(qtype: Q, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes for K-quant blocks (gguf-py cannot quantize K types); NaN scales are fine."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    return np.random.default_rng(seed).integers(0, 256, size=(rows, cols // block * type_size), dtype=np.uint8)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # random K-quant scales may be NaN
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.BF16, Q.F16,
                                   Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K])
def test_dequantization_matches_gguf_py(tmp_path: Path, qtype: Q) -> None:
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    cols = 512 if block == 256 else 64
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K):
        raw = _k_quant_blocks(qtype, 2, cols, int(qtype))
    else:
        values = np.random.default_rng(int(qtype)).standard_normal((2, cols), dtype=np.float32)
        raw = gguf.quants.quantize(values, qtype)
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    w.add_tensor("t", raw, raw_dtype=qtype if raw.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_gguf(tmp_path / "q.gguf") as f:
        got = f.load("t")
        assert got.dtype == np.float32 and got.shape == (2, cols)
        assert f.tensor_info("t").ggml_type == qtype.name
    want = gguf.quants.dequantize(raw.view(np.uint8) if raw.dtype != np.uint8 else raw, qtype)
    np.testing.assert_array_equal(got, want.astype(np.float32))
