"""Programmatic dependent launch (Hopper and later): a kernel launched with it may start while
the kernel before it in the stream is still finishing, and waits (griddepcontrol.wait) only
where it first reads what that kernel wrote. A decode step at batch 1 is ~180 kernels of a few
microseconds each, where the launch and ramp-up between two kernels is a visible share.

Kernels that take part call `wait_for_inputs(PDL)` before their first load or store and are
launched with `**pdl_launch(device)`. `MLXR_PDL=0` turns it off (read when a kernel launches,
so a CUDA graph keeps what was set when it was captured)."""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from mlxr.ops.backend import interpreting


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()  # the previous kernel has finished and its writes are visible
        tl.extra.cuda.gdc_launch_dependents()  # the next kernel may start launching now


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def pdl_launch(device: torch.device) -> dict:
    """Launch keywords: the kernel's PDL switch and, when on, Triton's launch_pdl option."""
    on = (device.type == "cuda" and not interpreting() and os.environ.get("MLXR_PDL", "1") != "0"
          and _capable(device.index if device.index is not None else torch.cuda.current_device()))
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}
