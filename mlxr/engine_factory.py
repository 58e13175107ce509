"""The one place an engine is built from a model reference: the offline API and the server both
come here. With EngineConfig.engine_process the engine core runs in its own process and loads
the weights there; this process keeps the tokenizer."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mlxr.config import EngineConfig
from mlxr.engine.core_client import MPClient
from mlxr.engine.engine_core import CoreParts
from mlxr.engine.llm_engine import EngineParts, LLMEngine
from mlxr.loader import LoadedModel, load_frontend, load_model

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelSpec:
    """How to load a model: what LLM() and the server's model manager were given."""

    ref: str
    dtype: torch.dtype | None = None
    device: torch.device | str | None = None
    weight_dtype: torch.dtype | None = None
    quantization: str | None = None

    def load(self, progress: Callable[[int, int], None] | None = None) -> LoadedModel:
        return load_model(self.ref, dtype=self.dtype, device=self.device, weight_dtype=self.weight_dtype,
                          quantization=self.quantization, progress=progress)

    def as_strings(self) -> dict[str, str | None]:
        name = {v: k for k, v in DTYPES.items()}
        return {"ref": self.ref, "dtype": name.get(self.dtype), "weight_dtype": name.get(self.weight_dtype),
                "device": None if self.device is None else str(self.device), "quantization": self.quantization}


def core_parts(ref: str, dtype: str | None, weight_dtype: str | None, device: str | None,
               quantization: str | None, draft: str | None = None) -> CoreParts:
    """The engine core process's factory (core_proc.py): the weights (and a speculative
    draft model's), loaded there."""
    spec = ModelSpec(ref, DTYPES.get(dtype), device, DTYPES.get(weight_dtype), quantization)
    loaded = spec.load()
    return CoreParts(loaded.model, loaded.args, loaded.dtype, loaded.device, _draft_parts(spec, draft))


def _draft_parts(spec: ModelSpec, draft: str | None) -> CoreParts | None:
    """The draft model, loaded as the target is (same dtype, device and quantization)."""
    if draft is None:
        return None
    loaded = ModelSpec(draft, spec.dtype, spec.device, spec.weight_dtype, spec.quantization).load()
    return CoreParts(loaded.model, loaded.args, loaded.dtype, loaded.device)


@dataclass(frozen=True)
class Built:
    engine: LLMEngine
    loaded: LoadedModel | None  # None when the weights live in the core's process
    args: object  # ModelArgs
    tokenizer: object


def build_engine(spec: ModelSpec, config: EngineConfig,
                 progress: Callable[[int, int], None] | None = None) -> Built:
    """progress(done, total) as the weights' tensors are placed (in this process only)."""
    own_process = config.engine_process
    if own_process is None:
        own_process = spec.device is not None and torch.device(spec.device).type == "cuda"
    if own_process:
        _, args, tokenizer = load_frontend(spec.ref)
        kwargs = {**spec.as_strings(), "draft": config.speculative_draft_model}
        client = MPClient("mlxr.engine_factory:core_parts", kwargs, config)
        parts = EngineParts(None, args, tokenizer, None, None)
        return Built(LLMEngine(parts, config, core=client), None, args, tokenizer)
    loaded = spec.load(progress)
    parts = EngineParts(loaded.model, loaded.args, loaded.tokenizer, loaded.dtype, loaded.device,
                        _draft_parts(spec, config.speculative_draft_model))
    return Built(LLMEngine(parts, config), loaded, loaded.args, loaded.tokenizer)
