"""Test helper: logits of every position through the engine's own paged path
(one prefill over the prompt, then one decode step per further token)."""
from __future__ import annotations

import torch

from mlxr.engine.records import NewRequestData, SchedulerOutput
from mlxr.types import SamplingParams


def paged_logits(llm, ids: list[int], n_prompt: int) -> torch.Tensor:
    """[len(ids), vocab] logits: row i predicts token i + 1, as a causal LM's forward does."""
    core = llm.engine.core.core
    runner, bm = core.runner, core.block_manager
    blocks = bm.take_blocks(bm.blocks_for(len(ids)))
    rid = "probe"
    prompt = SchedulerOutput(request_ids=[rid], num_scheduled_tokens=[n_prompt], num_computed_tokens=[0],
                             new_requests=[NewRequestData(rid, list(ids[:n_prompt]), n_prompt,
                                                          SamplingParams(temperature=0.0), [], blocks)])
    try:
        with torch.inference_mode():
            runner.batch.update(prompt)
            inputs = runner.batch.build(prompt, None, False, None)
            hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.layers, inputs.meta)
            rows = [runner.model.compute_logits(hidden).float()]
        state = runner.batch.states[rid]
        for i, token in enumerate(ids[n_prompt:]):
            state.token_ids.append(token)
            step = SchedulerOutput(request_ids=[rid], num_scheduled_tokens=[1], num_computed_tokens=[n_prompt + i])
            _, logits = runner.logits(step)
            rows.append(logits.clone())  # a graph replay's logits live in its static buffer
    finally:
        runner.batch.states.pop(rid, None)
        runner.batch.steady.forget()
        bm.release_blocks(blocks)
    return torch.cat(rows)


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref.double()).norm() / ref.double().norm())
