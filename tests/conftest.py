"""Shared test settings and fixtures, torch-free (tests/unit runs without torch): the models live in
model_fixtures.py, torch is imported only where a test needs it."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# Tests import these from model_fixtures: once folders have conftest.py files of their own, the
# module named `conftest` is whichever pytest loaded last.
from model_fixtures import FIXTURES


# Without a GPU the Triton kernels' tests run on Triton's CPU interpreter, which must be chosen
# before anything imports triton (its own library functions are decorated at import): a test
# folder collected before tests/kernels (the engine's) imports it. nvidia-smi, as the Makefile
# looks for a GPU: this file stays torch-free.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests reach into the engine core (runner, scheduler), so it runs in the test's process unless a
# test asks for its own process (engine_process=True, or MLXR_ENGINE_PROCESS=1 for a server).
os.environ.setdefault("MLXR_ENGINE_PROCESS", "0")

# Nothing a test runs (in this process or in the mlxr processes it starts, which inherit the
# environment) may write into the user's ~/.mlxr or ~/.cache/mlxr: the registry goes to a
# directory of this session, the compiled kernels to a cache beside the fixtures.
os.environ["MLXR_HOME"] = tempfile.mkdtemp(prefix="mlxr-test-home-")
os.environ["MLXR_CACHE_DIR"] = str(FIXTURES / "cache")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:  # no torch for a run without GPU tests (tests/unit)
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def client(base_url):
    """The official OpenAI client on the server of the module's `base_url` fixture."""
    import openai

    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    """The first model the module's server lists."""
    return client.models.list().data[0].id
