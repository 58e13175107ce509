"""The sampler's time per step on the CPU, by sampling parameters and batch size, on logits of
a given sharpness (a real model's next-token distributions are peaked: --scale 6 puts the 0.95
nucleus within a few hundred of 49k tokens; --scale 3 spreads it over thousands). Only the
Sampler's public call, so an older tree runs it too (`git stash` for a before/after pair).

  python bench/probes/sampler_cpu.py [--vocab 49152] [--rows 1 8 64] [--scale 6] [--label L]

JSON to bench/results/<day>/sampler_cpu-*.json.
"""
from __future__ import annotations

import argparse
import time

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import cpu_model, print_table, write_result

from mlxr.engine.worker.sampler import Sampler, SamplingState
from mlxr.types import SamplingParams

SETTINGS = {"greedy": {"temperature": 0.0}, "temperature": {"temperature": 0.8},
            "top_p": {"temperature": 0.8, "top_p": 0.95}, "ollama": {"temperature": 0.8, "top_k": 40, "top_p": 0.9}}


def ms_per_call(rows: int, vocab: int, scale: float, params: dict, seconds: float) -> float:
    p = SamplingParams(max_tokens=16, **params)
    states = [SamplingState(p, [1, 2, 3], [4, 5], frozenset({0}), None) for _ in range(rows)]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)) * scale
    sampler = Sampler()
    with torch.inference_mode():
        for _ in range(3):
            sampler(logits, states)
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sampler(logits, states)
            calls += 1
    return 1e3 * (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--scale", type=float, default=6.0)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    results = [{"rows": r, "setting": name, "ms": ms_per_call(r, a.vocab, a.scale, params, a.seconds)}
               for r in a.rows for name, params in SETTINGS.items()]
    print_table(results, ["rows", "setting", "ms"])
    print(write_result("sampler_cpu", {"cpu": cpu_model(), "threads": torch.get_num_threads(), "vocab": a.vocab,
                                       "scale": a.scale, "label": a.label, "settings": SETTINGS, "results": results}))


if __name__ == "__main__":
    main()
