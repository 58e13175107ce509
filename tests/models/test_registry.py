"""Model registry: facts read at import, names, path checks, and the database's safety."""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_fixtures import fixture_model
from safetensors import safe_open

from mlxr.errors import InvalidParameterError, ModelFormatError, ModelNotFoundError
from mlxr.formats.gguf import open_gguf
from mlxr.registry import BUNDLED_NAME, Registry, RegistryError, format_parameter_count
from mlxr.registry.names import default_name, parse_name


def sha256(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return "sha256:" + h.hexdigest()


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "home")


@pytest.fixture(scope="module")
def llama():
    return fixture_model("tiny-llama")


def test_import_gguf_facts(reg: Registry, llama) -> None:
    rec = reg.import_model(llama.gguf_path)
    with open_gguf(llama.gguf_path) as f:
        elements = sum(f.tensor_info(n).n_elements for n in f.tensor_names)
    assert rec.name == "model-f32:latest"
    assert (rec.format, rec.architecture, rec.family) == ("gguf", "llama", "llama")
    assert rec.parameter_count == elements and rec.parameter_size == format_parameter_count(elements)
    assert (rec.quantization, rec.context_length) == ("F32", 256)
    assert rec.size_bytes == llama.gguf_path.stat().st_size
    assert rec.digest == sha256(llama.gguf_path)
    assert rec.path.is_absolute() and rec.path == llama.gguf_path.resolve()
    assert rec.created_at.endswith("Z") and rec.last_used_at is None
    assert reg.resolve("model-f32") == rec == reg.resolve("model-f32:latest")


def test_import_gguf_f16_quantization(reg: Registry) -> None:
    rec = reg.import_model(fixture_model("tiny-llama", "f16").gguf_path, "tiny:f16")
    assert rec.quantization == "F16" and rec.details["quantization_level"] == "F16"


def test_import_hf_dir_facts(reg: Registry) -> None:
    hf = fixture_model("tiny-gemma3").hf_dir
    rec = reg.import_model(hf, "gem")
    with safe_open(hf / "model.safetensors", framework="numpy") as f:
        elements = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    assert rec.name == "gem:latest"
    assert (rec.format, rec.architecture, rec.quantization) == ("safetensors", "gemma3", "F32")
    assert rec.parameter_count == elements
    assert rec.context_length == json.loads((hf / "config.json").read_text())["max_position_embeddings"]
    assert rec.digest == sha256(hf / "model.safetensors")
    assert rec.size_bytes == sum(p.stat().st_size for p in hf.iterdir() if p.is_file())


def test_bundled_model_facts_and_cheap_reensure(reg: Registry, tmp_path: Path) -> None:
    rec = reg.ensure_bundled()
    assert rec.name == BUNDLED_NAME
    assert (rec.architecture, rec.quantization, rec.context_length) == ("gemma3", "Q4_K_M", 32768)
    assert (rec.parameter_count, rec.parameter_size) == (268_098_176, "268.10M")
    assert rec.digest == sha256(rec.path)

    def must_not_locate() -> Path:
        raise AssertionError("ensure_bundled looked for the file although it is registered")

    again = Registry(reg.home)
    t0 = time.perf_counter()
    assert again.ensure_bundled(must_not_locate) == rec
    assert time.perf_counter() - t0 < 0.1
    assert [r.name for r in again.list()] == [BUNDLED_NAME]


def test_ensure_bundled_reimports_a_changed_file(reg: Registry, llama, tmp_path: Path) -> None:
    model = tmp_path / "models" / "bundled.gguf"
    model.parent.mkdir()
    shutil.copy(llama.gguf_path, model)
    first = reg.ensure_bundled(lambda: model)
    shutil.copy(fixture_model("tiny-llama", "f16").gguf_path, model)
    second = reg.ensure_bundled(lambda: model)
    assert second.digest == sha256(model) != first.digest
    assert second.created_at == first.created_at and second.quantization == "F16"


def test_list_copy_remove_touch(reg: Registry, llama) -> None:
    a = reg.import_model(llama.gguf_path, "a")
    b = reg.copy("a", "team/b:v1")
    assert (b.name, b.digest, b.path) == ("team/b:v1", a.digest, a.path)
    assert sorted(r.name for r in reg.list()) == ["a:latest", "team/b:v1"]
    reg.touch("a")
    used = reg.resolve("a").last_used_at
    assert used is not None and used >= a.created_at
    reg.touch("a")  # throttled: a second write within a second changes nothing
    assert reg.resolve("a").last_used_at == used
    reg.touch("never-registered")  # ignored
    reg.remove("a")
    with pytest.raises(ModelNotFoundError, match="'a'"):
        reg.resolve("a")
    with pytest.raises(ModelNotFoundError):
        reg.remove("a")
    with pytest.raises(ModelNotFoundError):
        reg.copy("a", "c")
    assert [r.name for r in reg.list()] == ["team/b:v1"]
    assert b.path.exists()  # rm unregisters; it never deletes model files


def test_names_are_case_sensitive(reg: Registry, llama) -> None:
    reg.import_model(llama.gguf_path, "tiny")
    with pytest.raises(ModelNotFoundError):
        reg.resolve("Tiny")


def test_reimport_replaces_and_keeps_created_at(reg: Registry, llama) -> None:
    first = reg.import_model(llama.gguf_path, "m")
    second = reg.import_model(llama.hf_dir, "m")
    assert second.format == "safetensors" and second.created_at == first.created_at
    assert len(reg.list()) == 1


def test_progress_reports_bytes(reg: Registry, llama) -> None:
    seen: list[tuple[int, int]] = []
    reg.import_model(llama.gguf_path, progress=lambda done, total: seen.append((done, total)))
    size = llama.gguf_path.stat().st_size
    assert seen[0] == (0, size) and seen[-1] == (size, size)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))


BAD_NAMES = ["../x", "a/../../b", "/etc/passwd", "x:../../y", "a\0b", "", "a\\b", "a/b/c/d",
             ".hidden", "x:", ":tag", "a..b", "UPPER", "sp ace", "x" * 200]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_names_refused(reg: Registry, llama, bad: str) -> None:
    with pytest.raises(InvalidParameterError) as e:
        reg.import_model(llama.gguf_path, bad)
    assert e.value.param == "name"
    reg.import_model(llama.gguf_path, "ok")
    with pytest.raises(InvalidParameterError):
        reg.copy("ok", bad)
    with pytest.raises(ModelNotFoundError):
        reg.resolve(bad)
    assert [r.name for r in reg.list()] == ["ok:latest"]
    assert set(os.listdir(reg.home)) <= {"registry.db", "registry.db-wal", "registry.db-shm"}


@pytest.mark.parametrize("good", ["a", "qwen2.5:0.5b", "user/model:tag", "x_y-z:v1.2"])
def test_good_names(good: str) -> None:
    assert parse_name(good) == (good if ":" in good else good + ":latest")


def test_default_names_are_sanitized() -> None:
    assert default_name("TinyLlama-1.1B Chat") == "tinyllama-1.1b-chat:latest"
    assert default_name("..__") == "model:latest"
    assert default_name("a..b") == "a.b:latest"


def test_bad_paths_refused(reg: Registry, tmp_path: Path, llama) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    for bad in (tmp_path / "missing.gguf", fifo, Path("/dev/null"), empty_dir, text):
        with pytest.raises(InvalidParameterError):
            reg.import_model(bad, "x")
    assert reg.list() == []


def test_symlink_is_resolved(reg: Registry, tmp_path: Path, llama) -> None:
    link = tmp_path / "link.gguf"
    link.symlink_to(llama.gguf_path)
    assert reg.import_model(link).path == llama.gguf_path.resolve()


def _truncated(src: Path, dst: Path, keep: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


def test_corrupt_gguf_registers_nothing(reg: Registry, tmp_path: Path, llama) -> None:
    for keep in (0.001, 0.05, 0.5, 0.99):
        with pytest.raises(ModelFormatError):
            reg.import_model(_truncated(llama.gguf_path, tmp_path / "cut.gguf", keep), "cut")
    # A header claiming 2**40 tensors must be refused before anything is allocated.
    (tmp_path / "huge.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1 << 40) + bytes(4096))
    with pytest.raises(ModelFormatError):
        reg.import_model(tmp_path / "huge.gguf", "huge")
    assert reg.list() == []


def test_corrupt_hf_dir_registers_nothing(reg: Registry, tmp_path: Path, llama) -> None:
    broken = tmp_path / "hf"
    shutil.copytree(llama.hf_dir, broken)
    _truncated(llama.hf_dir / "model.safetensors", broken / "model.safetensors", 0.5)
    with pytest.raises(ModelFormatError):
        reg.import_model(broken, "broken")
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelFormatError):
        reg.import_model(broken, "broken")
    assert reg.list() == []


def test_database_settings_and_idempotent_migrations(tmp_path: Path, llama) -> None:
    home = tmp_path / "home"
    Registry(home).import_model(llama.gguf_path, "m")
    reg = Registry(home)  # migrating again must change nothing
    assert [r.name for r in reg.list()] == ["m:latest"]
    conn = sqlite3.connect(home / "registry.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,), (2,), (3,)]
    conn.execute("INSERT INTO schema_version VALUES (99)")
    conn.commit()
    conn.close()
    with pytest.raises(RegistryError, match="newer"):
        Registry(home)


def test_parameter_size_format() -> None:
    cases = {268_098_176: "268.10M", 1_100_048_384: "1.1B", 7_000_000_000: "7B",
             500_000_000: "500M", 139_584: "140K", 12: "12"}
    for n, text in cases.items():
        assert format_parameter_count(n) == text


def test_registry_does_not_import_torch() -> None:
    code = "import sys, mlxr.registry, mlxr.cli.list_models, mlxr.cli.import_model; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
