"""`mlxr serve --data-parallel-size` out of its range is refused by serve itself with a message
naming what was wrong; no core starts. More replicas than CUDA devices is refused too."""
from __future__ import annotations

import os
import subprocess

import pytest

from model_fixtures import fixture_model
from server_harness import ROOT, free_port, server_command


def refused(tmp_path, *flags: str) -> str:
    gguf = str(fixture_model("tiny-llama").gguf_path)
    cmd = server_command(tmp_path / "home", free_port(), "--model", gguf, *flags)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "MLXR_HOME": str(tmp_path / "home")})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    return done.stderr


@pytest.mark.parametrize("size", ["0", "65", "-2"])
def test_a_size_out_of_range_is_refused(tmp_path, size):
    assert refused(tmp_path, "--data-parallel-size", size).startswith("error: data_parallel_size: must be 1 to 64")


def test_more_replicas_than_cuda_devices_is_refused():
    import torch

    from mlxr import LLM
    from mlxr.errors import InvalidParameterError

    n = max(2, torch.cuda.device_count() + 1)
    with pytest.raises(InvalidParameterError, match=f"data_parallel_size: {n} replicas need {n} CUDA devices"):
        LLM(str(fixture_model("tiny-llama").hf_dir), device="cuda", data_parallel_size=n)
