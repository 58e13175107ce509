"""The layer rules of DESIGN.md, checked with import-linter."""
import shutil
import subprocess
import sys
from pathlib import Path


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([exe], cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
