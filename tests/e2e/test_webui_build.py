"""The built UI committed under mlxr/server/webui/static is what `npm run build` makes of webui/.

Slow (npm ci when node_modules is missing, then a build): run it after changing webui/ with
`pytest -m slow tests/e2e/test_webui_build.py`; `make webui` rebuilds."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from model_fixtures import ROOT

WEBUI = ROOT / "webui"
STATIC = ROOT / "mlxr" / "server" / "webui" / "static"


def files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_committed_build_matches_the_source(tmp_path):
    npm = shutil.which("npm")
    assert npm, "npm is needed to build the web UI (apt-get install -y nodejs npm)"
    if not (WEBUI / "node_modules").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=WEBUI, check=True)
    out = tmp_path / "static"
    subprocess.run([npm, "run", "build", "--", "--outDir", str(out), "--emptyOutDir"], cwd=WEBUI, check=True,
                   capture_output=True)
    built, committed = files(out), files(STATIC)
    assert sorted(built) == sorted(committed), "run `make webui` and commit mlxr/server/webui/static"
    assert [name for name in built if built[name] != committed[name]] == []
