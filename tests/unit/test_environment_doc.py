"""mlxr/environment.py declares every MLXR_* name the sources read, and docs/environment.md is
what it renders (torch-free)."""
from __future__ import annotations

import re
from pathlib import Path

from mlxr import environment

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bMLXR_[A-Z0-9_]+")
DECLARATION = ROOT / "mlxr" / "environment.py"


def names_in(folder: Path, suffixes: tuple[str, ...], skip: tuple[Path, ...] = ()) -> set[str]:
    found: set[str] = set()
    for path in folder.rglob("*"):
        if path.suffix in suffixes and path.is_file() and not any(path.is_relative_to(s) for s in skip):
            found.update(NAME.findall(path.read_text(errors="replace")))
    return found


def package_names() -> set[str]:
    return names_in(ROOT / "mlxr", (".py", ".c", ".h"), skip=(DECLARATION,))


def tooling_names() -> set[str]:
    bench = names_in(ROOT / "bench", (".py", ".sh"), skip=(ROOT / "bench" / "results",))
    tests = names_in(ROOT / "tests", (".py",), skip=(Path(__file__).resolve(),))
    return (bench | tests) - package_names()


def declared(switches: tuple[environment.Switch, ...]) -> set[str]:
    return {s.name for s in switches}


def test_every_name_the_package_reads_is_declared_and_every_declared_one_is_read():
    names = package_names()
    assert len(names) >= 28  # the scan reached the sources (the count when this was written)
    assert names - declared(environment.SWITCHES) == set(), "read under mlxr/ but not in SWITCHES"
    assert declared(environment.SWITCHES) - names == set(), "in SWITCHES but read nowhere under mlxr/"


def test_names_only_bench_and_tests_read_are_declared_as_tooling():
    names = tooling_names()
    assert names - declared(environment.TOOLING) == set(), "read in bench/ or tests/ but not in TOOLING"
    assert declared(environment.TOOLING) - names == set(), "in TOOLING but read nowhere in bench/ or tests/"


def test_each_name_is_declared_once_with_a_type_a_default_and_a_reason():
    switches = environment.SWITCHES + environment.TOOLING
    assert len(declared(switches)) == len(switches)
    for s in switches:
        assert s.type and s.default and len(s.why) > 20, s.name
        assert s.kind in (environment.ENVIRONMENT, environment.BUILD), s.name


def test_the_page_is_what_the_declaration_renders():
    page = ROOT / "docs" / "environment.md"
    assert page.read_text() == environment.render(), "regenerate: python -m mlxr.environment --write"
    for s in environment.SWITCHES + environment.TOOLING:
        assert f"`{s.name}`" in page.read_text()
