"""Issue #16 D3 and D7: counts and sizes a model file declares are checked before anything
is built from them, and every hostile file is a ModelFormatError with a clear message."""
from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest
from model_fixtures import fixture_model

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf_config import args_from_gguf
from mlxr.loader import load_model
from mlxr.models import gguf_architecture
from mlxr.registry import Registry

FIXTURE = fixture_model("tiny-llama")  # 2 layers


def patched_gguf(tmp_path: Path, key: str, value: int) -> Path:
    """The fixture GGUF with one uint32 metadata value rewritten in place (4 bytes)."""
    data = bytearray(FIXTURE.gguf_path.read_bytes())
    encoded = key.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded) + 8 + len(encoded)
    assert struct.unpack_from("<I", data, at)[0] == 4  # GGUF value type uint32
    struct.pack_into("<I", data, at + 4, value)
    path = tmp_path / f"{key}-{value}.gguf"
    path.write_bytes(bytes(data))
    return path


def hf_copy(tmp_path: Path) -> Path:
    path = tmp_path / "hf"
    shutil.copytree(FIXTURE.hf_dir, path)
    return path


def refused_fast(call, *words: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ModelFormatError) as e:
        call()
    assert time.monotonic() - t0 < 10
    for word in words:
        assert word in e.value.message, (word, e.value.message)


@pytest.mark.parametrize("count", [100_000, 0xFFFFFFFF, 3])
def test_gguf_block_count_is_checked_before_building(tmp_path, count):
    path = patched_gguf(tmp_path, "llama.block_count", count)
    registry = Registry(tmp_path / "home")
    refused_fast(lambda: registry.import_model(path), str(count))
    refused_fast(lambda: load_model(str(path)), str(count))


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 100_000), ("num_hidden_layers", 3),
                                       ("hidden_size", 10**30), ("intermediate_size", 2**62),
                                       ("vocab_size", 2**62), ("max_position_embeddings", 2**62)])
def test_hf_sizes_are_checked_before_building(tmp_path, key, value):
    path = hf_copy(tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, key: value}))
    refused_fast(lambda: load_model(str(path)), str(value))
    if value > 3:  # over a cap: import refuses too (it reads no tensor headers, so not a 3)
        refused_fast(lambda: Registry(tmp_path / "home").import_model(path), str(value))


def test_gguf_embedding_length_of_2_64_minus_1():
    metadata = {"general.architecture": "llama", "llama.embedding_length": 2**64 - 1,
                "llama.attention.head_count": 4, "llama.block_count": 2, "llama.feed_forward_length": 128}
    with pytest.raises(ModelFormatError, match="hidden_size"):
        args_from_gguf(metadata, has_output_tensor=True, vocab_size=512, declaration=gguf_architecture(metadata))


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_deeply_nested_json(tmp_path, name):
    path = hf_copy(tmp_path)
    (path / name).write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused_fast(lambda: load_model(str(path)), "nested")


def test_safetensors_header_nested_too_deeply(tmp_path):
    path = hf_copy(tmp_path)
    header = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    refused_fast(lambda: load_model(str(path)), "nested")


@pytest.mark.parametrize("content,words", [(b"{{ messages }}\xff\xfe", ("UTF-8",)),
                                           (b"x" * (2 << 20), ("larger",))])
def test_chat_template_jinja_must_be_small_utf8(tmp_path, content, words):
    path = hf_copy(tmp_path)
    (path / "chat_template.jinja").write_bytes(content)
    refused_fast(lambda: load_model(str(path)), "chat_template.jinja", *words)


def test_the_fixture_itself_still_loads(tmp_path):
    assert load_model(str(FIXTURE.gguf_path)).args.num_hidden_layers == 2
    assert load_model(str(FIXTURE.hf_dir)).args.num_hidden_layers == 2
