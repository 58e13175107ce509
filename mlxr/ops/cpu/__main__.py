"""`python -m mlxr.ops.cpu`: compile every C kernel library now, one line per library with
its time (`make install` runs it, so the first request does not pay the compile, and a
terminal shows progress rather than a silent minute)."""
from __future__ import annotations

import threading
import time

from mlxr.ops.cpu.cpu_build import LIBRARIES, load_library

TICK_S = 5.0  # a compile can take a minute on a busy 2-core machine: show it is still going


def _load_with_ticks(name: str) -> bool:
    done = threading.Event()
    result: list[bool] = []
    worker = threading.Thread(target=lambda: (result.append(load_library(name) is not None), done.set()))
    worker.start()
    while not done.wait(TICK_S):
        print(".", end="", flush=True)
    worker.join()
    return bool(result and result[0])


def main() -> int:
    failed = 0
    for i, name in enumerate(LIBRARIES, 1):
        print(f"  CPU kernels [{i}/{len(LIBRARIES)}] {name} ...", end="", flush=True)
        t0 = time.perf_counter()
        ok = _load_with_ticks(name)
        failed += not ok
        print(f" {'ready' if ok else 'unavailable (torch fallback)'} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if failed < len(LIBRARIES) else 1


if __name__ == "__main__":
    raise SystemExit(main())
