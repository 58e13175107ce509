"""The unit tier's guard (tests/unit/conftest.py): a unit session that imports torch fails and
names the import; one that does not passes."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent


def _run_unit_copy(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    unit = tmp_path / "unit"
    unit.mkdir()
    shutil.copy(UNIT / "conftest.py", unit / "conftest.py")
    (unit / "test_probe.py").write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(unit)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("body", "fails"), [
    ("def test_pure():\n    assert 1 + 1 == 2\n", False),
    ("def test_imports_torch():\n    import torch  # noqa: F401\n", True),
], ids=["pure", "imports-torch"])
def test_a_unit_session_fails_when_torch_is_imported(tmp_path, body, fails):
    run = _run_unit_copy(tmp_path, body)
    assert "1 passed" in run.stdout, run.stdout[-2000:]
    assert (run.returncode != 0) == fails, run.stdout[-2000:]
    assert ("tests/unit imported torch" in run.stdout) == fails
    if fails:
        assert "test_probe.py" in run.stdout  # the stack names the test that imported it
