"""Ollama's `format` -> StructuredOutputsParams: "json" is any JSON object, an object is a JSON
schema, "" or null is none."""
from __future__ import annotations

from typing import Any

from mlxr.types import StructuredOutputsParams


def structured_outputs(fmt: Any) -> StructuredOutputsParams | None:
    if not fmt:
        return None
    if fmt == "json":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=fmt)
