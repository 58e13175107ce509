"""`mlxr import / list / show / cp / rm` as a user runs them, with MLXR_HOME in tmp_path."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from model_fixtures import fixture_model

MLXR = Path(sys.executable).parent / "mlxr"


def mlxr(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLXR_HOME": str(home)}
    return subprocess.run([str(MLXR), *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def gguf() -> Path:
    return fixture_model("tiny-llama").gguf_path


def test_import_list_show_cp_rm(tmp_path: Path, gguf: Path) -> None:
    home = tmp_path / "home"
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    out = mlxr(home, "import", str(gguf), "--name", "tiny:f32")
    assert out.returncode == 0, out.stderr
    assert "tiny:f32" in out.stdout and digest[:12] in out.stdout

    lines = mlxr(home, "list").stdout.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert lines[1].split()[:2] == ["tiny:f32", digest[:12]] and "KB" in lines[1]

    show = mlxr(home, "show", "tiny:f32").stdout
    for fact in ("llama", "F32", "256", str(gguf.resolve()), f"sha256:{digest}"):
        assert fact in show

    assert mlxr(home, "cp", "tiny:f32", "copy").returncode == 0
    assert mlxr(home, "rm", "tiny:f32").returncode == 0
    names = [line.split()[0] for line in mlxr(home, "list").stdout.splitlines()[1:]]
    assert names == ["copy:latest"]
    assert gguf.exists()


def test_errors_exit_1(tmp_path: Path, gguf: Path) -> None:
    home = tmp_path / "home"
    for args in (("show", "nope"), ("rm", "nope"), ("cp", "nope", "x"),
                 ("import", str(gguf), "--name", "../evil"), ("import", str(tmp_path / "missing.gguf"))):
        out = mlxr(home, *args)
        assert out.returncode == 1, args
        assert out.stderr.startswith("error: "), out.stderr
    assert mlxr(home, "list").stdout.splitlines()[1:] == []


def test_home_option_wins_over_env(tmp_path: Path, gguf: Path) -> None:
    env_home, opt_home = tmp_path / "env", tmp_path / "opt"
    assert mlxr(env_home, "import", str(gguf), "--home", str(opt_home)).returncode == 0
    assert (opt_home / "registry.db").exists() and not env_home.exists()


def test_corrupt_file_is_refused(tmp_path: Path, gguf: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf.read_bytes()[:1000])
    out = mlxr(tmp_path / "home", "import", str(cut))
    assert out.returncode == 1 and "GGUF" in out.stderr
    assert mlxr(tmp_path / "home", "list").stdout.splitlines()[1:] == []
