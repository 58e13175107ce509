"""Shared pieces of the bench scripts: environment facts, result files, the printed table."""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Callable

import torch

RESULTS = Path(__file__).parent / "results"  # one folder a day (UTC): results/2026-11-24/name-stamp.json


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_model()} ({torch.get_num_threads()} threads)"


def cpu_model() -> str:
    """The CPU's model name (CPU figures differ by host kind), from /proc/cpuinfo on Linux."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """MLXR_COMMIT where set (the lent GPU machine's copy of the tree may carry a stale .git)."""
    if os.environ.get("MLXR_COMMIT"):
        return os.environ["MLXR_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def results_dir(now: dt.datetime) -> Path:
    """Where a result goes: $MLXR_BENCH_RESULTS (bench/sweep.py collects its parts there), else
    the day's folder under bench/results, so the history does not crowd one folder."""
    override = os.environ.get("MLXR_BENCH_RESULTS")
    return Path(override) if override else RESULTS / now.strftime("%Y-%m-%d")


_NOT_KNOBS = ("MLXR_BENCH_RESULTS", "MLXR_COMMIT")  # where results go, which tree: not behaviour


def write_result(name: str, payload: dict) -> Path:
    now = dt.datetime.now(dt.timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    knobs = {k: v for k, v in sorted(os.environ.items()) if k.startswith("MLXR_") and k not in _NOT_KNOBS}
    payload = {"date": stamp, "commit": git_commit(), "torch": torch.__version__, "env": knobs, **payload}
    folder = results_dir(now)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}"
    return "-" if v is None else str(v)


def dtype_label(llm) -> str:
    """Activations and weights of an LLM whose model is in this process; else the engine
    core's process holds it."""
    if llm.loaded is None:
        return "in the engine core's process"
    return f"{llm.loaded.dtype} act / {llm.loaded.weight_dtype} weights".replace("torch.", "")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


PHASE_NAMES = {"build": "prepare", "update_from_output": "update", "process": "detokenize"}


def time_engine_phases(engine, spent) -> Callable[[], object]:
    """Wrap the step's phases (schedule, prepare, execute, launch, land, update, and the
    frontend's detokenize) so each adds its seconds to spent[phase]; returns the unwrapper."""
    import time

    core = engine.core.core
    targets = {"schedule": core.scheduler, "build": core.runner.batch, "execute": core.runner,
               "launch": core.runner.sampler, "land": core.in_flight, "update_from_output": core.scheduler,
               "process": engine.output}
    for name, obj in targets.items():
        fn = getattr(obj, name)

        def wrapper(*args, _fn=fn, _key=PHASE_NAMES.get(name, name.strip("_")), **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_key] += time.perf_counter() - t0
        setattr(obj, name, wrapper)
    return lambda: [delattr(obj, name) for name, obj in targets.items()]


def peer_figures(pairs: list[str] | None) -> dict[str, list[float]]:
    """`--llama-cpp NAME=V[,V...]` arguments: llama.cpp's figures measured in the same lease
    (e.g. by ../shared/peers/gpu_side_by_side.sh build), so a ratio never compares with a
    number from another machine or day. None or empty: no ratio column."""
    figures = {}
    for pair in pairs or []:
        name, _, values = pair.partition("=")
        figures[name] = [float(v) for v in values.split(",")]
    return figures

