"""Test helper: logits of every position through the engine's own paged path
(one prefill over the prompt, then one decode step per further token)."""
from __future__ import annotations

import torch

from mlxr.engine.scheduler import ScheduledSeq, SchedulerOutput
from mlxr.engine.sequence import Sequence


def paged_logits(llm, ids: list[int], n_prompt: int) -> torch.Tensor:
    """[len(ids), vocab] logits: row i predicts token i + 1, as a causal LM's forward does."""
    engine = llm.engine
    runner, bm = engine.runner, engine.block_manager
    seq = Sequence(-1, "probe", 0, list(ids[:n_prompt]), n_prompt, 0.0)
    bm.allocate(seq, n_prompt)
    try:
        with torch.inference_mode():
            inputs = runner.prepare(SchedulerOutput([ScheduledSeq(seq, n_prompt)]))
            hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.layers, inputs.meta)
            rows = [runner.model.compute_logits(hidden).float()]
        seq.num_computed_tokens = n_prompt
        for token in ids[n_prompt:]:
            seq.token_ids.append(token)
            bm.allocate(seq, seq.num_tokens)
            _, logits = runner.execute(SchedulerOutput([ScheduledSeq(seq, 1)]))
            seq.num_computed_tokens += 1
            rows.append(logits.clone())  # a graph replay's logits live in its static buffer
    finally:
        bm.free(seq)
    return torch.cat(rows)


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref.double()).norm() / ref.double().norm())
