"""bench/'s house: results land in one folder a day (or where bench/sweep.py collects them), the
scripts in bench's folders (kernels, peers, gpu, probes) still find bench's shared modules, the
README says what each script measures, and every bench path the tree names exists."""
from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
FOLDERS = ("kernels", "peers", "gpu")  # probes/ has a README of its own


@pytest.fixture()
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    return common


def test_results_go_to_the_days_folder(common, monkeypatch, tmp_path):
    monkeypatch.delenv("MLXR_BENCH_RESULTS", raising=False)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    path = common.write_result("probe", {"x": 1})
    day = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    assert path.parent == tmp_path / day and path.name.startswith("probe-")
    assert json.loads(path.read_text())["x"] == 1


def test_sweep_collects_results_where_it_says(common, monkeypatch, tmp_path):
    monkeypatch.setenv("MLXR_BENCH_RESULTS", str(tmp_path / "part"))
    assert common.write_result("latency", {}).parent == tmp_path / "part"


@pytest.mark.parametrize("probe", ["host_phases", "step_probe", "gc_ab", "mask_fill", "constrained_host"])
def test_probes_import_benchs_shared_modules(probe):
    run = subprocess.run([sys.executable, str(BENCH / "probes" / f"{probe}.py"), "--help"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "usage" in run.stdout, run.stderr[-2000:]


def test_sweep_knows_both_devices():
    run = subprocess.run([sys.executable, str(BENCH / "sweep.py"), "--help"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "--device {cpu,cuda}" in run.stdout


@pytest.mark.parametrize("script", ["kernels/kv_tier_copies.py", "peers/llama_cpp_cpu.py", "gpu/gpu_sweep.py"])
def test_each_folders_scripts_import_shared_modules(script):
    """Each imports modules of bench/ (common, latency, quant_cpu) and of another folder's scripts."""
    run = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "usage" in run.stdout, run.stderr[-2000:]


def _scripts():
    for folder in (BENCH, *(BENCH / name for name in FOLDERS)):
        for path in sorted(folder.iterdir()):
            if path.suffix in (".py", ".sh") and path.name not in ("bench_path.py", "bench_folders.py"):
                yield path.relative_to(BENCH).as_posix()


def test_readme_says_what_each_script_measures():
    readme = (BENCH / "README.md").read_text()
    listed = {m.group(1) for m in re.finditer(r"`([\w/]+\.(?:py|sh))`", readme)}
    unlisted = [s for s in _scripts() if s not in listed and s.split("/")[-1] not in listed]
    assert not unlisted, f"bench/README.md does not say what these measure: {unlisted}"


def test_lease_scripts_are_named_by_what_they_run():
    numbered = [s for s in _scripts() if re.search(r"(issue|_)\d+\.(sh|py)$", s)]
    assert not numbered, numbered


def _texts():
    for pattern in ("Makefile", "*.md", "*.toml", "docs/**/*.md", "mlxr/**/*.py", "tests/**/*.py", "bench/**/*.py",
                    "bench/**/*.sh", "bench/**/*.md", ".ci/*"):
        for path in ROOT.glob(pattern):
            if "results" not in path.relative_to(ROOT).parts and path.is_file():
                yield path


def test_every_bench_path_named_exists():
    missing = set()
    for path in _texts():
        for m in re.finditer(r"(?<![\w/.])bench/([a-z0-9_/]+\.(?:py|sh|md))", path.read_text(errors="replace")):
            if not (BENCH / m.group(1)).exists():
                missing.add(f"{path.relative_to(ROOT)}: bench/{m.group(1)}")
    assert not missing, sorted(missing)
