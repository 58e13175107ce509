"""kill -9 during registry writes, from one process and from several at once: the database
stays consistent and every row is a complete import whose digest matches its files."""
from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from model_fixtures import fixture_model

from mlxr.registry import Registry, bundled_model_path

WORKER = """
import random, sys
from pathlib import Path
from mlxr.errors import ModelNotFoundError
from mlxr.registry import Registry
import mlxr.models.model_args  # facts read through the architectures' declarations (torch): loaded
                               # before "ready", so the kills land among the writes, not the import

home, seed, *models = sys.argv[1:]
reg = Registry(Path(home))
rng = random.Random(int(seed))
print("ready", flush=True)
while True:
    op, name = rng.random(), f"m{rng.randrange(4)}"
    try:
        if op < 0.5:
            reg.import_model(Path(rng.choice(models)), name)
        elif op < 0.7:
            reg.copy(name, f"c{rng.randrange(4)}")
        elif op < 0.85:
            reg.remove(name)
        else:
            reg.touch(name)
    except ModelNotFoundError:
        pass
"""


def _sha256(path: Path) -> str:
    files = [path] if path.is_file() else [path / "model.safetensors"]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return "sha256:" + h.hexdigest()


def _tree(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def models() -> dict[str, str]:
    """Model path -> its digest: two tiny ones and the 250 MB bundled GGUF, so that kills
    land in validation, in hashing and in the INSERT."""
    tiny = fixture_model("tiny-llama")
    paths = [tiny.gguf_path.resolve(), tiny.hf_dir.resolve(), bundled_model_path().resolve()]
    return {str(p): _sha256(p) for p in paths}


def _start(home: Path, seeds: list[int], models: dict[str, str], cwd: Path) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(home), str(seed), *models],
                              stdout=subprocess.PIPE, cwd=cwd) for seed in seeds]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return procs


def _kill(proc: subprocess.Popen) -> None:
    assert proc.poll() is None, "the worker died on its own: it hit an error"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


def _check_consistent(home: Path, models: dict[str, str]) -> int:
    conn = sqlite3.connect(home / "registry.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM models").fetchall()
    finally:
        conn.close()
    for row in rows:
        assert row["path"] in models, row["path"]
        assert row["digest"] == models[row["path"]], row["name"]
        missing = [k for k in row.keys() if row[k] is None and k not in ("last_used_at", "projector")]
        assert not missing and row["parameter_count"] > 0 and row["size_bytes"] > 0
    assert len(Registry(home).list()) == len(rows)
    return len(rows)


def test_sigkill_during_writes_leaves_a_consistent_registry(tmp_path: Path, models) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    rng = random.Random(1234)
    before = _tree(tmp_path, home)
    registered = 0
    for round_ in range(6):
        [proc] = _start(home, [round_], models, cwd)
        time.sleep(rng.uniform(0.0, 0.5))
        _kill(proc)
        registered = max(registered, _check_consistent(home, models))
    assert registered > 0  # the workers did get writes in between the kills
    assert _tree(tmp_path, home) == before  # nothing written outside home, not even in cwd


def test_concurrent_writers_killed_together(tmp_path: Path, models) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    Registry(home)
    before = _tree(tmp_path, home)
    rng = random.Random(99)
    for round_ in range(2):
        procs = _start(home, [100 * round_ + i for i in range(3)], models, cwd)
        time.sleep(rng.uniform(0.4, 0.8))
        for proc in procs:
            _kill(proc)
        _check_consistent(home, models)
    assert _tree(tmp_path, home) == before
