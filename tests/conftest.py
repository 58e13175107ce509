"""Shared test fixtures: random-weight models written once per checkout under .fixtures/."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

# Tests reach into the engine core (runner, scheduler), so it runs in the test's process unless a
# test asks for its own process (engine_process=True, or MLXR_ENGINE_PROCESS=1 for a server).
os.environ.setdefault("MLXR_ENGINE_PROCESS", "0")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / ".fixtures"

# Nothing a test runs (in this process or in the mlxr processes it starts, which inherit the
# environment) may write into the user's ~/.mlxr or ~/.cache/mlxr: the registry goes to a
# directory of this session, the compiled kernels to a cache beside the fixtures.
os.environ["MLXR_HOME"] = tempfile.mkdtemp(prefix="mlxr-test-home-")
os.environ["MLXR_CACHE_DIR"] = str(FIXTURES / "cache")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def fixture_model(name: str, gguf_type: str | None = None):
    from mlxr.testing.fixtures import fixture_paths

    return fixture_paths(name, FIXTURES, gguf_type)


_LLMS: dict = {}


def cached_llm(model: str, **kwargs):
    """One LLM per (model, knobs) for the whole session: loading is the slow part."""
    from mlxr import LLM

    key = (model, tuple(sorted(kwargs.items())))
    if key not in _LLMS:
        _LLMS[key] = LLM(model, dtype=torch.float32, **kwargs)
    return _LLMS[key]


@pytest.fixture(scope="module")
def client(base_url):
    """The official OpenAI client on the server of the module's `base_url` fixture."""
    import openai

    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    """The first model the module's server lists."""
    return client.models.list().data[0].id
