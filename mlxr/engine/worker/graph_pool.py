"""What every kind of captured graph shares: one forward captured at a set of sizes at
start-up, largest first (so the smaller ones reuse its memory pool), within a time budget
past which the sizes left run eagerly; and its replay, which leaves the logits in the
graph's static output (valid until the next replay). The budget counts capture, not the
kernels compiled on the way (a first start on an empty kernel cache compiles most of them
here): `compile_seconds` tells that time, set by the engine core's compile watch; without it,
everything counts.

A kind says what a size's forward is (_forward), fills its static inputs before a size is
captured (_prepare) and names the sizes that a stopped capture leaves eager (_eager_rest)."""
from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger(__name__)


def _no_compiles() -> float:
    return 0.0


compile_seconds = _no_compiles  # seconds this process spent compiling kernels so far


class GraphPool:
    kind = "graph"  # "captured 3 <kind>s"

    def __init__(self, sizes: list[int], pool=None) -> None:
        self.sizes = sizes
        self.graphs: dict[int, tuple] = {}  # size -> (its graph, its static logits)
        self.pool = pool  # the CUDA memory pool the graphs share (given: another kind's)

    def _prepare(self, size: int) -> None:
        """Fill the static inputs that size's capture reads (padding: the scratch block)."""

    def _forward(self, size: int) -> torch.Tensor:
        """size's forward over the static inputs: the logits the graph leaves."""
        raise NotImplementedError

    def _eager_rest(self, size: int) -> str:
        """The sizes from `size` down, which a capture stopped at its budget leaves eager."""
        return f"size {size} and below"

    @torch.inference_mode()
    def _capture_all(self, budget_s: float) -> None:
        t0, compiled0 = time.perf_counter(), compile_seconds()
        order = sorted(self.sizes, reverse=True)
        t_log = t0
        for i, size in enumerate(order):
            compiling = compile_seconds() - compiled0
            if time.perf_counter() - t0 - compiling > budget_s:
                log.warning("%s capture stopped at the %.0fs budget; %s run eagerly", self.kind, budget_s,
                            self._eager_rest(size))
                break
            if i == 0 or time.perf_counter() - t_log > 2.0:  # progress, not silence, on a cold start
                log.info("capturing %ss: size %d (%d of %d), %.1fs so far (%.1fs compiling kernels)",
                         self.kind, size, i + 1, len(order), time.perf_counter() - t0, compiling)
                t_log = time.perf_counter()
            self._prepare(size)
            self.graphs[size] = self._capture(size)
        log.info("captured %d %ss in %.1fs (%.1fs of it compiling kernels)", len(self.graphs), self.kind,
                 time.perf_counter() - t0, compile_seconds() - compiled0)

    def _capture(self, size: int) -> tuple:
        """A CUDA graph of size's forward, after two warm-up runs outside it (the allocator,
        the kernels' autotuning)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(size)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(size)
        self.pool = graph.pool()
        return graph, logits

    def _replay(self, size: int) -> torch.Tensor:
        """Replay size's graph over its static inputs (filled by the caller): its logits."""
        graph, logits = self.graphs[size]
        graph.replay()
        return logits
