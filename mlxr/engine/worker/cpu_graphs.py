"""The CPU's decode graphs: each padded batch size's forward recorded once (mlxr/ops/cpu/cpu_plan.py)
and replayed as its native calls, without the modules' Python.

Sizes are every row count up to CPU_GRAPH_MAX_ROWS, so no step is padded (a padding row costs
the CPU as much as a real one) and a row computes as it would eagerly. Past that, steps run
eagerly: their kernels' time dwarfs the Python's. Each recording is checked once against an
eager forward of the same inputs; a model whose forward cannot be recorded, or whose replay
differs, runs eagerly (logged)."""
from __future__ import annotations

import logging

import torch

from mlxr.engine.worker.cuda_graphs import DecodeGraphs
from mlxr.ops.cpu.cpu_plan import NativePlan, PlanUnsupported, record

log = logging.getLogger(__name__)

# Decode rows (drafts included) that replay a recording: the C kernels' pool takes matmuls of up
# to 8 rows (ops/quant/pool.h), and larger batches are bound by their kernels.
CPU_GRAPH_MAX_ROWS = 8


def cpu_graph_sizes(max_batch: int) -> list[int]:
    return list(range(1, min(max_batch, CPU_GRAPH_MAX_ROWS) + 1))


class CpuDecodeGraphs(DecodeGraphs):
    graph_sizes = staticmethod(cpu_graph_sizes)
    kind = "decode CPU graph"

    def _capture_all(self, budget_s: float) -> None:
        self.threads = torch.get_num_threads()  # the kernels' thread count is an argument baked in
        super()._capture_all(budget_s)

    def fits(self, n: int, width: int) -> bool:
        if torch.get_num_threads() != self.threads:  # Ollama's num_thread, --threads: record again
            self._record_again()
        return super().fits(n, width)

    def _record_again(self) -> None:
        self.graphs = {}
        try:
            self._capture_all(60.0)
        except PlanUnsupported as e:  # steps run eagerly from here
            self.graphs = {}
            log.warning("CPU decode steps run eagerly: %s", e)

    def _capture(self, size: int) -> tuple[NativePlan, torch.Tensor]:
        g = self.inputs[size]
        self._forward(size)  # first calls load libraries and fill caches outside the recording
        plan = record(lambda: self._forward(size))
        logits = plan.result
        # Other tokens than the recording's: a call the recording missed would leave its old result.
        g.input_ids.fill_(1)
        expected = self._forward(size).clone()
        logits.zero_()
        plan.replay()
        g.input_ids.zero_()
        if not torch.equal(logits, expected):
            raise PlanUnsupported(f"a replay of the {g.b}-row forward differs from an eager forward")
        return plan, logits


def cpu_decode_graphs(model: torch.nn.Module, kv_cache, scratch_block: int, max_batch: int,
                      max_blocks_per_seq: int) -> CpuDecodeGraphs | None:
    """The recordings, or None (logged) where the model's forward cannot be replayed."""
    try:
        return CpuDecodeGraphs(model, kv_cache, scratch_block, max_batch, max_blocks_per_seq)
    except PlanUnsupported as e:
        log.warning("CPU decode steps run eagerly: %s", e)
        return None
