"""The layer rules of DESIGN.md, checked with import-linter."""
import shutil
import subprocess
import sys
from pathlib import Path


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([exe], cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_engine_has_no_import_cycles():
    """The engine's files import one way (records and requests at the bottom, the core and its
    clients on top): no file reaches back to one that imports it, lazily or not."""
    import grimp

    graph = grimp.build_graph("mlxr")
    engine = sorted(m for m in graph.modules if m.startswith("mlxr.engine."))
    cycles = []
    for m in engine:
        for imported in graph.find_modules_directly_imported_by(m):
            if imported.startswith("mlxr.engine.") and graph.find_shortest_chain(importer=imported, imported=m):
                cycles.append((m, imported))
    assert cycles == []
