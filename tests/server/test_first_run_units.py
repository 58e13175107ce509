"""The pure parts of a first run: whether a model carries its own chat template."""
from __future__ import annotations

from mlxr.server.ollama.model_info import template_origin


def test_template_origin() -> None:
    assert template_origin("{{ messages }}", "llama") == "model"
    assert template_origin(None, "gemma3") == "built-in"
    assert template_origin(None, "llama") == "none"
