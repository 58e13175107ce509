"""Test helper: logits of every position through the engine's own paged path
(one prefill over the prompt, then one decode step per further token)."""
from __future__ import annotations

import torch

from mlxr.engine.records import NewRequestData, SchedulerOutput
from mlxr.types import SamplingParams


def paged_logits(llm, ids: list[int], n_prompt: int, lora: str = "") -> torch.Tensor:
    """[len(ids), vocab] logits: row i predicts token i + 1, as a causal LM's forward does
    (with the loaded LoRA adapter of that name, if given)."""
    from mlxr.engine.worker.lora_step import adapter_slots_update, lora_step

    core = llm.engine.core.core
    runner, bm = core.runner, core.block_manager
    blocks = bm.take_blocks(bm.blocks_for(len(ids)))
    rid = "probe"
    lora_id = core.adapters.get(lora).lora_id if lora else 0
    prompt = SchedulerOutput(request_ids=[rid], num_scheduled_tokens=[n_prompt], num_computed_tokens=[0],
                             new_requests=[NewRequestData(rid, list(ids[:n_prompt]), n_prompt,
                                                          SamplingParams(temperature=0.0), [], blocks, [], lora_id)])
    try:
        with torch.inference_mode():
            if runner.lora is None:
                runner.batch.update(prompt)
            else:
                adapter_slots_update(runner.lora, runner.batch, prompt)
            inputs = runner.batch.build(prompt, None, False, None)
            with lora_step(runner.lora.targets.step, runner.batch, prompt, runner.device) if runner.lora else _none():
                hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.model_layers, inputs.meta)
            rows = [runner.model.compute_logits(hidden).float()]
        state = runner.batch.states[rid]
        for i, token in enumerate(ids[n_prompt:]):
            state.token_ids.append(token)
            step = SchedulerOutput(request_ids=[rid], num_scheduled_tokens=[1], num_computed_tokens=[n_prompt + i])
            _, logits = runner.logits(step)
            rows.append(logits.clone())  # a graph replay's logits live in its static buffer
    finally:
        state = runner.batch.states.pop(rid, None)
        if state is not None and state.lora_slot >= 0:
            runner.lora.release(state.lora_slot)
        runner.batch.steady.forget()
        bm.release_blocks(blocks)
    return torch.cat(rows)


def _none():
    import contextlib

    return contextlib.nullcontext()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref.double()).norm() / ref.double().norm())


def paged_image_logits(llm, ids: list[int], images: list) -> torch.Tensor:
    """[len(ids), vocab] logits of a prompt with images (ImageInputs) in one prefill, as the
    runner computes a step with image rows."""
    core = llm.engine.core.core
    runner, bm = core.runner, core.block_manager
    blocks = bm.take_blocks(bm.blocks_for(len(ids)))
    rid = "probe-images"
    step = SchedulerOutput(request_ids=[rid], num_scheduled_tokens=[len(ids)], num_computed_tokens=[0],
                           new_requests=[NewRequestData(rid, list(ids), len(ids), SamplingParams(temperature=0.0),
                                                        [], blocks, images)])
    try:
        with torch.inference_mode():
            runner.batch.update(step)
            runner.images.update(step)
            inputs = runner.batch.build(step, None, False, None)
            found = runner.images.for_step(step)
            embeds = runner.model.embed(inputs.input_ids)
            embeds.index_copy_(0, found.rows, found.embeddings)
            if runner.images.bidirectional:
                inputs.meta.bidirectional = found.spans
            if runner.mrope is not None:  # M-RoPE (Qwen2.5-VL): the runner's 3-part positions
                runner.mrope.update(step)
                inputs.meta.rope_positions = runner.mrope.for_step(step, inputs.meta.query_lens_list)
            hidden = runner.model(inputs.input_ids, inputs.positions, runner.kv_cache.model_layers, inputs.meta, embeds)
            return runner.model.compute_logits(hidden).float()
    finally:
        runner.batch.states.pop(rid, None)
        runner.images.update(SchedulerOutput(finished_request_ids=[rid]))
        if runner.mrope is not None:
            runner.mrope.update(SchedulerOutput(finished_request_ids=[rid]))
        bm.release_blocks(blocks)


def assert_image_prompt_matches_hf(llm, hf, inputs: dict, ids: list[int], prompt, text: str, images: list,
                                   tokens: int = 24) -> None:
    """An image prompt against HF transformers: prompt logits through the paged path within
    ||d||/||ref|| <= 1e-4, and `tokens` greedy tokens through llm.generate identical."""
    from mlxr.types import ImagePrompt

    ours = paged_image_logits(llm, ids, prompt.images)
    with torch.inference_mode():
        ref = hf(**inputs).logits[0]
        want = hf.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)[0, len(ids):].tolist()
    assert rel_err(ours, ref) <= 1e-4
    got = llm.generate([ImagePrompt(text, images)], SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    assert got[0].outputs[0].token_ids == want
