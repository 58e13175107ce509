"""Which implementation an op's dispatcher runs: the Triton kernel or the torch reference.

CUDA tensors take the Triton kernel; everything else (CPU, meta) takes the reference.
`MLXR_KERNELS=reference` forces the reference on CUDA too, for A/B comparisons. The variable
is read here rather than in config.py because it is a debugging switch below the model API,
read per call so a test can flip it.
"""
from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(*tensors: torch.Tensor) -> bool:
    if not all(t.is_cuda for t in tensors):
        return False
    if os.environ.get("MLXR_KERNELS", "auto") == "reference":
        return False
    return triton_available()


@functools.cache
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of the device (a small stand-in under the interpreter)."""
    if device.type != "cuda":
        return 4
    return num_sms(device.index if device.index is not None else torch.cuda.current_device())


_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def ticket_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 counters for kernels whose last program of a group does the group's final
    step (split-K sums, attention partition merges); each kernel sets its counters back to
    zero, so launches share the buffer. Outgrown buffers stay alive: a CUDA graph captured
    with one keeps its address."""
    bufs = _COUNTERS.setdefault(device, [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, 4096), dtype=torch.int32, device=device))
    return bufs[-1]
