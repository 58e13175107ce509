"""The tests' random-weight models, written once per checkout under .fixtures/, and one loaded LLM
per (model, knobs) for the session. Torch-free at import (tests/unit imports no torch)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / ".fixtures"


def fixture_model(name: str, gguf_type: str | None = None):
    from mlxr.testing.fixtures import fixture_paths

    return fixture_paths(name, FIXTURES, gguf_type)


_LLMS: dict = {}


def cached_llm(model: str, **kwargs):
    """One LLM per (model, knobs) for the whole session: loading is the slow part."""
    import torch

    from mlxr import LLM

    key = (model, tuple(sorted(kwargs.items())))
    if key not in _LLMS:
        _LLMS[key] = LLM(model, dtype=torch.float32, **kwargs)
    return _LLMS[key]
