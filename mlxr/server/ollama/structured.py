"""Ollama's `format` -> StructuredOutputsParams: "json" is any JSON object, an object is a JSON
schema, "" or null is none. vLLM's `structured_outputs` field is taken beside it (one of the two)."""
from __future__ import annotations

from typing import Any

from mlxr.errors import InvalidParameterError
from mlxr.server.openai.structured import vllm_constraint
from mlxr.types import StructuredOutputsParams


def structured_outputs(fmt: Any, extra: dict[str, Any] | None = None) -> StructuredOutputsParams | None:
    other = vllm_constraint(extra)
    if other is not None and fmt:
        raise InvalidParameterError("structured_outputs", "give one constraint; format is already one")
    if not fmt:
        return other
    if fmt == "json":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=fmt)
