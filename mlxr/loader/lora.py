"""LoRA adapters in the model's own names: a GGUF LoRA's tensor names (blk.N.attn_q) mapped to
the HF module paths PEFT uses, and its q/k B rows un-permuted as the base's are (llama.cpp's
converter permutes them for its rotary layout), so one adapter reads the same from either file."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

from mlxr.errors import AdapterError, MLXRError
from mlxr.formats.lora_adapter import AdapterFile, LoRABounds, LoRAPair, read_adapter
from mlxr.loader.gguf_weights import hf_name, to_hf_layout
from mlxr.model_config import ModelArgs


def adapter_reader(args: ModelArgs) -> Callable[[str, str | os.PathLike[str], LoRABounds], AdapterFile]:
    """read_adapter for a base of these args (the engine core's CoreParts.read_adapter)."""
    def read(name: str, path: str | os.PathLike[str], bounds: LoRABounds) -> AdapterFile:
        adapter = read_adapter(name, path, bounds)
        return adapter if adapter.kind != "gguf" else _hf_names(adapter, args)

    return read


def _hf_names(adapter: AdapterFile, args: ModelArgs) -> AdapterFile:
    pairs = {}
    for gguf_base, pair in adapter.pairs.items():
        try:
            target = hf_name(f"{gguf_base}.weight", args)
        except MLXRError as e:
            raise AdapterError(f"LoRA adapter {adapter.name!r}: {e.message}") from None
        if target is None:
            raise AdapterError(f"LoRA adapter {adapter.name!r}: tensor {gguf_base!r} is not a projection of the base model")
        try:
            b = to_hf_layout(target, pair.b, args)
        except MLXRError as e:
            raise AdapterError(f"LoRA adapter {adapter.name!r}: {gguf_base}: {e.message}") from None
        pairs[target.removesuffix(".weight")] = LoRAPair(pair.a, b)
    return replace(adapter, pairs=pairs)
