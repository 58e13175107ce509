"""SentencePiece tokenizer.model files as `tokenizers` backends: the protobuf ModelProto read
field by field, so that no protobuf runtime is needed."""
from __future__ import annotations

import struct
from pathlib import Path

import tokenizers
from tokenizers import Regex, normalizers

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.json_file import MAX_JSON_BYTES
from mlxr.tokenizer.gguf_vocab import build_sentencepiece_bpe, build_sentencepiece_unigram

MAX_MODEL_BYTES = MAX_JSON_BYTES  # the largest model file read: as for the tokenizer's JSON files

# Field numbers are those of sentencepiece_model.proto.
_ProtoFields = dict[int, list[int | bytes]]
_SPM_UNIGRAM, _SPM_BPE = 1, 2


def load_sentencepiece_model(path: Path) -> tuple[tokenizers.Tokenizer, dict[str, int | None]]:
    """A `tokenizers` equivalent of a SentencePiece model file, plus its bos/eos ids."""
    if path.stat().st_size > MAX_MODEL_BYTES:
        raise ModelFormatError(f"{path.name} is larger than {MAX_MODEL_BYTES} bytes")
    model = _proto_fields(path.read_bytes())
    trainer = _proto_fields(_proto_bytes(model, 2, b""))
    norm = _proto_fields(_proto_bytes(model, 3, b""))
    tokens, scores, types = [], [], []
    for raw in model.get(1, []):
        piece = _proto_fields(raw if isinstance(raw, bytes) else b"")
        try:
            tokens.append(_proto_bytes(piece, 1, b"").decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ModelFormatError(f"{path.name} holds a piece that is not UTF-8") from e
        scores.append(_proto_float(piece, 2))
        types.append(_proto_int(piece, 3, 1))
    if not tokens:
        raise ModelFormatError(f"{path.name} holds no pieces")
    prefix = bool(_proto_int(norm, 3, 1))
    extra = _spm_normalizers(norm)
    kind = _proto_int(trainer, 3, _SPM_UNIGRAM)
    if kind == _SPM_BPE:
        backend = build_sentencepiece_bpe(tokens, scores, types, prefix, pre_normalizers=extra)
    elif kind == _SPM_UNIGRAM:
        fallback = bool(_proto_int(trainer, 35, 0))
        backend = build_sentencepiece_unigram(tokens, scores, types, prefix, fallback, extra)
    else:
        raise UnsupportedModelError(f"SentencePiece model type {kind} is not supported (unigram, bpe)")
    ids = {"bos": _proto_int(trainer, 41, 1), "eos": _proto_int(trainer, 42, 2)}
    return backend, {k: (v if 0 <= v < len(tokens) else None) for k, v in ids.items()}


def _spm_normalizers(norm: _ProtoFields) -> list[normalizers.Normalizer]:
    steps: list[normalizers.Normalizer] = []
    charsmap = _proto_bytes(norm, 2, b"")
    if charsmap and _proto_bytes(norm, 1, b"") != b"identity":
        steps.append(normalizers.Precompiled(charsmap))
    if _proto_int(norm, 4, 1):  # remove_extra_whitespaces; \A \z since ^ $ match at lines here
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    return steps


def _proto_fields(data: bytes) -> _ProtoFields:
    fields: _ProtoFields = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        value, pos = _proto_value(data, pos, key & 7)
        fields.setdefault(key >> 3, []).append(value)
    return fields


def _proto_value(data: bytes, pos: int, wire: int) -> tuple[int | bytes, int]:
    if wire == 0:
        return _varint(data, pos)
    if wire == 2:
        size, pos = _varint(data, pos)
    elif wire in (1, 5):
        size = 8 if wire == 1 else 4
    else:
        raise ModelFormatError(f"SentencePiece model has an unknown protobuf wire type {wire}")
    if size < 0 or pos + size > len(data):
        raise ModelFormatError("SentencePiece model is truncated")
    return data[pos:pos + size], pos + size


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise ModelFormatError("SentencePiece model is truncated")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result - (1 << 64) if result >= 1 << 63 else result), pos
    raise ModelFormatError("SentencePiece model has a malformed varint")


def _proto_int(fields: _ProtoFields, number: int, default: int) -> int:
    value = fields.get(number, [default])[-1]
    if not isinstance(value, int):
        raise ModelFormatError(f"SentencePiece model field {number} must be an integer")
    return value


def _proto_float(fields: _ProtoFields, number: int) -> float:
    value = _proto_bytes(fields, number, bytes(4))
    if len(value) != 4:
        raise ModelFormatError(f"SentencePiece model field {number} must be a float")
    return float(struct.unpack("<f", value)[0])


def _proto_bytes(fields: _ProtoFields, number: int, default: bytes) -> bytes:
    value = fields.get(number, [default])[-1]
    if not isinstance(value, bytes):
        raise ModelFormatError(f"SentencePiece model field {number} must be bytes")
    return value
