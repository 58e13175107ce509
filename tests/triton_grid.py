"""Imported by Triton kernel tests before any kernel module: without CUDA the kernels run on
Triton's CPU interpreter (TRITON_INTERPRET=1, read when @triton.jit runs), so CI checks them
on tiny shapes; DEVICES parametrizes a test over that CPU grid and the `gpu` one."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter grid")),
           pytest.param("cuda", marks=pytest.mark.gpu)]
