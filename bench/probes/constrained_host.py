"""The host pieces of a constrained batch step, each timed alone on this host, rows replaying
what the model wrote under bench/structured_overhead.py's schema: the mask's allocation each step
(as before: torch.full, pinned where masks go to CUDA) against the persistent buffers
(mask_job.MaskBuffers), the landed tokens taken one row at a time (GrammarState.advance) against
in one batch (llguidance's consume_token_par), the fill in this thread row by row / in one call (a one-thread executor) / on the executor, the
worker hand-off (mask_job.FillThread.start until the worker runs), the sampler's per-row
seeded draws (what the step thread does while a worker fills), and the hand-off back: the step
thread busy in Python until BUSY_S after the start, past the fill's end, then waiting for the
result (the worker, its fill done, waits for the GIL until the step thread blocks; what is left
is two thread wake-ups and the worker's few lines), and a mixed batch's unconstrained rows set
to all-allowed one at a time against in one index_fill_. Median microseconds a step.
JSON to bench/results/<day>/constrained_host-*.json.

  python bench/probes/constrained_host.py --model smollm2:135m --device cuda [--rows 64] [--steps 48]
"""
from __future__ import annotations

import os
import time

import bench_path  # noqa: F401,I001  (bench/ on sys.path)
from common import device_name, median, print_table, write_result
from structured_overhead import SCHEMA, cpu_model
from mask_fill import model_paths, rows_args


BUSY_S = 0.004  # past a batch-64 fill on the executor (1.3 ms on the H100 host), under the 5 ms GIL switch interval


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = rows_args()
    a = ap.parse_args()
    import llguidance
    import llguidance.torch as llg_torch
    import torch

    from mlxr import LLM
    from mlxr.engine.worker.sampler import make_generator
    from mlxr.engine.structured.mask_job import FillThread, MaskBuffers
    from mlxr.engine.structured.matcher import GrammarState, executor
    from mlxr.engine.structured.grammar import grammar_text, parser_limits
    from mlxr.types import StructuredOutputsParams

    llm = LLM(a.model, device=a.device, engine_process=False, max_num_seqs=a.rows)
    paths = model_paths(llm, a.rows, a.steps)
    compiler = llm.engine.core.core.structured._compiler
    ll, vocab = compiler.ll_tokenizer(), compiler.vocab_size
    words, pin, device = (vocab + 31) // 32, a.device == "cuda", torch.device(a.device)
    text = grammar_text(StructuredOutputsParams(json=SCHEMA))

    def states():
        return [GrammarState(llguidance.LLMatcher(ll, text, limits=parser_limits(), log_level=0))
                for _ in range(a.rows)]

    one, many, pool = states(), states(), executor()
    one_thread = llguidance.LLExecutor(num_threads=1)  # the engine's serial fills, in one call
    buffers, worker = MaskBuffers(words, pin), FillThread()
    gens = [make_generator(i, device) for i in range(a.rows)]
    u = torch.empty(a.rows, dtype=torch.float64, device=device)
    spent: dict[str, list[float]] = {k: [] for k in (
        "alloc_full", "buffers_take", "advance_rows", "advance_par", "fill_this_thread", "fill_one_call", "fill_executor",
        "worker_handoff", "seeded_draws", "end_handoff", "reset_rows_loop", "reset_rows_index")}
    for step in range(min(len(p) for p in paths)):
        spent["alloc_full"].append(timed(
            lambda: torch.full((a.rows, words), -1, dtype=torch.int32, pin_memory=pin)))
        spent["buffers_take"].append(timed(lambda: buffers.take(a.rows)))
        free = list(range(1, a.rows))  # a mixed batch: one constrained row, the others' words all set
        spent["reset_rows_loop"].append(timed(lambda: [buffers.take(a.rows)[i].fill_(-1) for i in free]))
        spent["reset_rows_index"].append(timed(
            lambda: buffers.take(a.rows).index_fill_(0, torch.tensor(free, dtype=torch.long), -1)))
        mask = buffers.take(a.rows)
        pairs = [(s.matcher, i) for i, s in enumerate(one)]
        # The same rows filled twice: the second fill finds the lexer's states warm, so each
        # goes first on alternate steps.
        fills = [("fill_one_call", lambda: llg_torch.fill_next_token_bitmask_par(one_thread, pairs, mask)),
                 ("fill_this_thread", lambda: [llg_torch.fill_next_token_bitmask(m, mask, i) for m, i in pairs])]
        for name, fill in fills[::1 if step % 2 else -1]:
            spent[name].append(timed(fill))
        spent["fill_executor"].append(timed(lambda: llg_torch.fill_next_token_bitmask_par(
            pool, [(s.matcher, i) for i, s in enumerate(many)], mask)))
        t0 = time.perf_counter()
        future = worker.start(lambda: llg_torch.fill_next_token_bitmask_par(pool, pairs, mask))
        spent["worker_handoff"].append(time.perf_counter() - t0)
        spent["seeded_draws"].append(timed(lambda: [u[i: i + 1].uniform_(generator=g) for i, g in enumerate(gens)]))
        while time.perf_counter() - t0 < BUSY_S:
            pass
        spent["end_handoff"].append(timed(future.result))
        tokens = [p[step] for p in paths]
        spent["advance_rows"].append(timed(lambda: [s.advance(t) for s, t in zip(one, tokens)]))
        spent["advance_par"].append(timed(
            lambda: pool.consume_token_par([(s.matcher, t) for s, t in zip(many, tokens)])))
        for s in many:
            s.num_tokens += 1
    if a.device == "cuda":
        torch.cuda.synchronize()
    rows = [{"piece": k, "us_per_step": 1e6 * median(v), "us_per_row": 1e6 * median(v) / a.rows}
            for k, v in spent.items()]
    print_table(rows, ["piece", "us_per_step", "us_per_row"])
    print(write_result("constrained_host", {
        "model": a.model, "device": device_name(a.device), "cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(), "rows": a.rows, "steps": len(spent["alloc_full"]),
        "vocab": vocab, "results": rows}))


if __name__ == "__main__":
    main()
