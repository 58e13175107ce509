"""Graph capture's time budget counts capture, not kernel compiles: a first start on an empty
kernel cache compiles most kernels while capturing, and must still capture every size (the
2026-12-01 lease's 8B Q4_K_M first start left batch 2 and below eager and decoded at half the
restarted speed)."""
from __future__ import annotations

import time

from mlxr.engine.worker import graph_pool
from mlxr.engine.worker.graph_pool import GraphPool


class _CompilingKind(GraphPool):
    """A kind whose every capture spends its time compiling (as reported by compile_seconds)."""

    kind = "test graph"

    def __init__(self, sizes, compiled: list[float], spend_s: float, compiling: bool) -> None:
        super().__init__(sizes)
        self.compiled, self.spend_s, self.compiling = compiled, spend_s, compiling

    def _capture(self, size: int) -> tuple:
        time.sleep(self.spend_s)
        if self.compiling:
            self.compiled[0] += self.spend_s
        return None, None


def _captured(monkeypatch, compiling: bool) -> list[int]:
    compiled = [0.0]
    monkeypatch.setattr(graph_pool, "compile_seconds", lambda: compiled[0])
    pool = _CompilingKind([1, 2, 4, 8], compiled, 0.2, compiling)
    pool._capture_all(budget_s=0.3)
    return sorted(pool.graphs)


def test_compile_time_does_not_use_up_the_capture_budget(monkeypatch):
    assert _captured(monkeypatch, compiling=True) == [1, 2, 4, 8]


def test_capture_time_still_does(monkeypatch, caplog):
    with caplog.at_level("WARNING"):
        assert _captured(monkeypatch, compiling=False) == [4, 8]  # largest first; stopped past the budget
    assert "batch" not in caplog.text and "size 2 and below run eagerly" in caplog.text
