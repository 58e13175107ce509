"""A step's LoRA inputs: each row's adapter slot held from the runner's first sight of the
request to its end, and each token's slot set on the model's LoRAStep for one forward.

The decode CUDA graphs hold the adapters' products (cuda_graphs.DecodeGraphs reads the slots set
here into its buffer); prefill and CPU graphs do not: a step of those with an adapter row runs
eagerly, one of base rows alone replays them as before, through the wrappers' bases."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from mlxr.engine.records import SchedulerOutput
from mlxr.engine.worker.input_batch import InputBatch
from mlxr.engine.worker.lora_slots import AdapterSlots
from mlxr.layers.lora import LoRAStep


def adapter_slots_update(slots: AdapterSlots, batch: InputBatch, out: SchedulerOutput) -> None:
    """batch.update(out), releasing the slots of requests it forgets and taking those of new ones."""
    for rid in (*out.finished_request_ids, *out.preempted_request_ids):
        state = batch.states.get(rid)
        if state is not None and state.lora_slot >= 0:
            slots.release(state.lora_slot)
            state.lora_slot = -1
    batch.update(out)
    for new in out.new_requests:
        if new.lora_id:
            batch.states[new.request_id].lora_slot = slots.acquire(new.lora_id)


@contextlib.contextmanager
def lora_step(step: LoRAStep, batch: InputBatch, out: SchedulerOutput, device: torch.device) -> Iterator[bool]:
    """Sets each token's slot on step while the forward runs; yields whether any row has one."""
    rows = [batch.states[rid].lora_slot for rid in out.request_ids]
    if max(rows) < 0:
        yield False
        return
    # Built in Python: torch.repeat_interleave and nonzero cost milliseconds a call on the CPU.
    per_token = [s for s, n in zip(rows, out.num_scheduled_tokens) for _ in range(n)]
    step.token_slots = torch.tensor(per_token, dtype=torch.long).to(device, non_blocking=True)
    distinct = sorted({s for s in rows if s >= 0})
    if len(distinct) == 1 and min(rows) >= 0:
        step.groups = [(distinct[0], None)]
    else:
        at: dict[int, list[int]] = {s: [] for s in distinct}
        for i, s in enumerate(per_token):
            if s >= 0:
                at[s].append(i)
        step.groups = [(s, torch.tensor(at[s], dtype=torch.long).to(device, non_blocking=True)) for s in distinct]
    try:
        yield True
    finally:
        step.clear()
