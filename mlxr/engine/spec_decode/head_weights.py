"""Reading a draft head's tensors (safetensors only) and placing them in a module built without
weights, every name and shape checked: a head that does not fit its target is a clear error."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from mlxr.errors import ModelFormatError
from mlxr.formats.safetensors_dir import iter_safetensors


def read_tensors(model_dir: str | Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """The checkpoint's tensors whose names start with prefix (prefix removed)."""
    out = {}
    for raw in iter_safetensors(model_dir):
        if raw.name.startswith(prefix):
            array = np.ascontiguousarray(raw.array)
            t = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16) if raw.dtype == "BF16" else torch.from_numpy(array)
            out[raw.name[len(prefix):]] = t
    return out


def place_weights(module: nn.Module, tensors: dict[str, torch.Tensor], what: str, dtype: torch.dtype,
                  device: torch.device, optional: tuple[str, ...] = ()) -> nn.Module:
    """Assign tensors to module's parameters (built on the meta device), each checked against
    the parameter's name and shape; optional names may be absent (the caller fills them)."""
    expected = dict(module.named_parameters())
    state = {}
    for name, tensor in tensors.items():
        if name not in expected:
            raise ModelFormatError(f"{what}: unexpected tensor {name!r}")
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise ModelFormatError(f"{what}: tensor {name!r} has shape {tuple(tensor.shape)}, the target needs {want}")
        state[name] = tensor.to(device=device, dtype=dtype)
    missing = [n for n in expected if n not in state and n not in optional]
    if missing:
        raise ModelFormatError(f"{what} lacks tensors: {', '.join(missing[:5])}")
    module.load_state_dict(state, strict=False, assign=True)
    for m in module.modules():
        if hasattr(m, "reset_buffers"):
            m.reset_buffers(device)
    return module.eval()
