"""An engine's LoRA set-up: the model's projections wrapped, the adapter slots made and the
adapters named at start (EngineConfig.lora_modules) loaded; a bad one stops the start with
its error."""
from __future__ import annotations

from mlxr.config import EngineConfig
from mlxr.errors import InvalidParameterError
from mlxr.engine.worker.lora_slots import AdapterSlots
from mlxr.formats.lora_adapter import LoRABounds, read_adapter
from mlxr.layers.lora import LoRATargets, attach_lora


def attach_core_lora(parts, config: EngineConfig) -> LoRATargets | None:
    if not (config.enable_lora or config.lora_modules):
        return None
    if config.parallel.tensor_parallel_size > 1:
        raise InvalidParameterError("enable_lora", "LoRA adapters are not offered with tensor_parallel_size > 1 yet")
    return attach_lora(parts.model, config.max_loras, config.max_lora_rank, parts.dtype, parts.device)


def adapter_slots(targets: LoRATargets, parts, config: EngineConfig) -> AdapterSlots:
    bounds = LoRABounds(config.max_lora_rank, config.lora_max_bytes, config.lora_max_tensors)
    slots = AdapterSlots(targets, parts.read_adapter or read_adapter, bounds)
    for name, path in config.lora_modules:
        slots.load(name, path)
    return slots


def lora_stats(slots: AdapterSlots | None, scheduler) -> dict:
    """EngineStats' LoRA fields: the slots, and the adapters running and waiting by name."""
    if slots is None:
        return {}

    def names(requests) -> tuple[str, ...]:
        return tuple(sorted({slots.by_id[r.lora_id].name for r in requests if r.lora_id and r.lora_id in slots.by_id}))

    return {"max_lora": slots.targets.slots, "running_lora_adapters": names(scheduler.running),
            "waiting_lora_adapters": names([*scheduler.waiting, *scheduler.swapped])}
