"""The layer rules of docs/design.md, checked with import-linter."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([exe], cwd=root, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def _imports_inside_functions(path: Path, modules: set[str]) -> set[str]:
    """The mlxr.engine modules that a file's functions import (not its top level)."""
    found = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlxr.engine"):
                    # `from package import module` imports the module; `from module import name`, the module
                    found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                              for a in node.names}
                elif isinstance(node, ast.Import):
                    found |= {a.name for a in node.names if a.name.startswith("mlxr.engine")}
    return found


def test_the_engine_has_no_import_cycles():
    """The engine's files import one way (records and requests at the bottom, the core and its
    clients on top): no file reaches back to one that imports it, lazily or not."""
    import grimp

    graph = grimp.build_graph("mlxr")
    root = Path(__file__).resolve().parents[2]
    lazy = 0  # grimp's graph holds the imports inside functions too: the check counts them
    for m in (m for m in graph.modules if m.startswith("mlxr.engine.")):
        path = root / (m.replace(".", "/") + ".py")
        for imported in _imports_inside_functions(path, graph.modules) if path.exists() else ():
            lazy += 1
            assert graph.direct_import_exists(importer=m, imported=imported), (m, imported)
    assert lazy > 0
    engine = sorted(m for m in graph.modules if m.startswith("mlxr.engine."))
    cycles = []
    for m in engine:
        for imported in graph.find_modules_directly_imported_by(m):
            if imported.startswith("mlxr.engine.") and graph.find_shortest_chain(importer=imported, imported=m):
                cycles.append((m, imported))
    assert cycles == []


def test_the_package_has_no_import_cycles():
    """No module of mlxr reaches back to one that imports it, counting imports inside functions
    (a lazy import that closes a loop still makes the two modules one unit)."""
    import grimp

    graph = grimp.build_graph("mlxr")
    cycles = []
    for m in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(m)):
            if imported.split(".")[0] != "mlxr":
                continue
            back = graph.find_shortest_chain(importer=imported, imported=m)
            if back:
                cycles.append(" -> ".join((m, *back)))
    assert cycles == []
