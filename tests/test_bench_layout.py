"""bench/'s house: results land in one folder a day (or where bench/sweep.py collects them),
and the probes moved to bench/probes/ still find bench's shared modules."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


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
