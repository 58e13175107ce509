"""The cyclic collector's settings for a process that serves an engine: the engine core's, and
the frontend's (the `LLM` API or an API server) when the core runs in its own process.

The frontend of a batch-256 decode builds as many short-lived objects a step as the core
(outputs, deltas, text), and with Python's defaults it ran a full collection once per ~0.3 s
that walked the tokenizer's vocabulary and everything else loaded: 70-94 ms pauses, one in
nearly every batch-256 run of bench/gpu/gpu_sweep.py (H200, .probe GC callbacks, 2026-11-28),
where a run's decode lasts ~0.25 s."""
from __future__ import annotations

import atexit
import gc

_GC_TUNED = False
# (young objects, young collections a middle one, middle collections a full one). A decode
# step at batch 256 leaves over a thousand tracked objects that reference counting frees soon
# after, so Python's default (700, 10, 10) ran about two young collections a step (counted
# with gc.callbacks on bench/probes/host_phases.py's fixture), and full ones often, for
# nothing: the engine breaks its own cycles. Interleaved runs on one H200 host: batch 256
# decode median 98.8k tok/s with the defaults, 102.7k with these (bench/probes/gc_ab.py,
# gc_ab-20261124T123005Z.json).
GC_THRESHOLDS = (50_000, 50, 100)


def tune_gc_once() -> None:
    """Once per process, after the first model (or the frontend's tokenizer) loads: freeze the
    objects of loading (weights' Python wrappers, vocabularies), which live on and which every
    full collection walked (~100 ms pauses of a busy decode loop), and raise the collector's
    thresholds (never lowering one the application set). Later loads stay collectable."""
    global _GC_TUNED
    if not _GC_TUNED:
        _GC_TUNED = True
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)  # frozen objects are never freed at exit; bindings complain
        gc.set_threshold(*(max(now, want) for now, want in zip(gc.get_threshold(), GC_THRESHOLDS)))
