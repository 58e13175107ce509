"""LoRA adapter files, read without torch: a PEFT directory (adapter_config.json beside
adapter_model.safetensors) or a GGUF LoRA written by llama.cpp's convert_lora_to_gguf.py
(general.type "adapter", adapter.lora.alpha). Each becomes a table of (A, B) pairs per module
with the adapter's scaling folded into B; the names stay the file's own (PEFT's HF module paths,
GGUF's base tensor names): the loader maps GGUF names and the layers check the pairs against the
base. Every bound (rank, bytes, tensors) is checked before the weights are read."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlxr.errors import AdapterError, MLXRError
from mlxr.formats.gguf import open_gguf
from mlxr.formats.json_file import read_json_object
from mlxr.formats.safetensors_dir import iter_safetensors_file

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
_PEFT_PREFIX = "base_model.model."
_PEFT_SUFFIXES = {".lora_A.weight": "a", ".lora_B.weight": "b"}
_GGUF_SUFFIXES = {".weight.lora_a": "a", ".weight.lora_b": "b"}


@dataclass(frozen=True)
class LoRABounds:
    """What one adapter may cost: its rank (--max-lora-rank), its file's bytes and tensors."""

    max_rank: int = 64
    max_bytes: int = 4 << 30
    max_tensors: int = 4096


@dataclass(frozen=True)
class LoRAPair:
    a: np.ndarray  # [rank, in] float32
    b: np.ndarray  # [out, rank] float32, the adapter's scaling folded in

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True)
class AdapterFile:
    name: str
    path: str
    kind: str  # "peft" | "gguf"
    pairs: dict[str, LoRAPair] = field(default_factory=dict)  # module name -> its pair
    target_modules: tuple[str, ...] = ()  # PEFT's list as written (empty: a regex, or GGUF)


def read_adapter(name: str, path: str | os.PathLike[str], bounds: LoRABounds) -> AdapterFile:
    """The adapter at path (a PEFT directory or a GGUF file); any fault is an AdapterError
    naming the adapter and what was wrong."""
    p = Path(path)
    try:
        if p.is_dir():
            return _read_peft(name, p, bounds)
        if p.is_file():
            return _read_gguf(name, p, bounds)
    except AdapterError:
        raise
    except MLXRError as e:
        raise AdapterError(f"LoRA adapter {name!r}: {e.message}") from None
    except (OSError, ValueError, RecursionError, MemoryError) as e:
        raise AdapterError(f"LoRA adapter {name!r}: cannot read {p}: {e}") from None
    raise AdapterError(f"LoRA adapter {name!r}: {p} is neither a PEFT directory nor a GGUF file")


def _fail(name: str, why: str) -> AdapterError:
    return AdapterError(f"LoRA adapter {name!r}: {why}")


def _check_size(name: str, path: Path, bounds: LoRABounds) -> None:
    size = path.stat().st_size
    if size > bounds.max_bytes:
        raise _fail(name, f"{path.name} is {size} bytes, over the bound of {bounds.max_bytes} (lora_max_bytes)")


# --- PEFT ------------------------------------------------------------------------------------
def _read_peft(name: str, root: Path, bounds: LoRABounds) -> AdapterFile:
    config = read_json_object(root / PEFT_CONFIG, MAX_CONFIG_BYTES)
    rank, alpha, rslora = _peft_scalars(name, config)
    if rank > bounds.max_rank:
        raise _fail(name, f"rank r={rank} is over --max-lora-rank {bounds.max_rank}")
    weights = root / PEFT_WEIGHTS
    if not weights.is_file():
        raise _fail(name, f"{root} has no {PEFT_WEIGHTS}")
    _check_size(name, weights, bounds)
    halves: dict[str, dict[str, np.ndarray]] = {}
    for count, tensor in enumerate(iter_safetensors_file(weights), 1):
        if count > bounds.max_tensors:
            raise _fail(name, f"{PEFT_WEIGHTS} holds more than {bounds.max_tensors} tensors (lora_max_tensors)")
        module, half = _peft_name(name, tensor.name)
        halves.setdefault(module, {})[half] = _float32(tensor.array, tensor.dtype)

    def scale(r: int) -> float:
        return alpha / math.sqrt(r) if rslora else alpha / r

    targets = config.get("target_modules")
    listed = tuple(targets) if isinstance(targets, list) and all(isinstance(t, str) for t in targets) else ()
    return AdapterFile(name, str(root), "peft", _pairs(name, halves, bounds, scale), listed)


def _peft_scalars(name: str, config: dict) -> tuple[int, float, bool]:
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise _fail(name, f"peft_type {config.get('peft_type')!r} is not LORA")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise _fail(name, f"{PEFT_CONFIG}: r must be a positive integer, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise _fail(name, f"{PEFT_CONFIG}: lora_alpha must be a number, got {alpha!r}")
    for key, allowed in (("use_dora", (False, None)), ("bias", ("none", None)),
                         ("modules_to_save", (None, [])), ("alpha_pattern", (None, {}))):
        if config.get(key) not in allowed:
            raise _fail(name, f"{PEFT_CONFIG}: {key}={config.get(key)!r} is not supported")
    rslora = config.get("use_rslora", False)
    if not isinstance(rslora, bool) or not isinstance(config.get("fan_in_fan_out", False), bool):
        raise _fail(name, f"{PEFT_CONFIG}: use_rslora and fan_in_fan_out must be true or false")
    # fan_in_fan_out only transposes a Conv1D base weight (GPT-2); A and B are plain linears either way.
    return rank, float(alpha), rslora


def _peft_name(name: str, tensor: str) -> tuple[str, str]:
    for suffix, half in _PEFT_SUFFIXES.items():
        if tensor.endswith(suffix):
            return tensor.removesuffix(suffix).removeprefix(_PEFT_PREFIX), half
    raise _fail(name, f"tensor {tensor!r} is not a LoRA A or B matrix (only lora_A/lora_B weights are served)")


# --- GGUF ------------------------------------------------------------------------------------
def _read_gguf(name: str, path: Path, bounds: LoRABounds) -> AdapterFile:
    _check_size(name, path, bounds)
    with open_gguf(path) as f:
        meta = f.metadata
        if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
            raise _fail(name, f"{path.name} is not a GGUF LoRA adapter (general.type="
                              f"{meta.get('general.type')!r}, adapter.type={meta.get('adapter.type')!r})")
        alpha = meta.get("adapter.lora.alpha", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise _fail(name, f"adapter.lora.alpha must be a number, got {alpha!r}")
        names = f.tensor_names
        if len(names) > bounds.max_tensors:
            raise _fail(name, f"{path.name} holds {len(names)} tensors, over {bounds.max_tensors} (lora_max_tensors)")
        halves: dict[str, dict[str, np.ndarray]] = {}
        for tensor in names:
            module, half = _gguf_name(name, tensor)
            shape = f.tensor_info(tensor).shape  # A [rank, in], B [out, rank]
            rank = (shape[0] if half == "a" else shape[-1]) if len(shape) == 2 else None
            if rank is None or rank > bounds.max_rank:
                raise _fail(name, f"tensor {tensor!r} has shape {list(shape)}, not a LoRA matrix of rank <= "
                                  f"--max-lora-rank {bounds.max_rank}")
            halves.setdefault(module, {})[half] = np.asarray(f.load(tensor), dtype=np.float32)
    # llama.cpp scales by alpha / rank, and by 1 when the file says no alpha.
    return AdapterFile(name, str(path), "gguf",
                       _pairs(name, halves, bounds, lambda r: alpha / r if alpha else 1.0))


def _gguf_name(name: str, tensor: str) -> tuple[str, str]:
    for suffix, half in _GGUF_SUFFIXES.items():
        if tensor.endswith(suffix):
            return tensor.removesuffix(suffix), half
    raise _fail(name, f"tensor {tensor!r} is not a LoRA A or B matrix (norms and embeddings are not served)")


# --- shared ----------------------------------------------------------------------------------
def _pairs(name: str, halves: dict[str, dict[str, np.ndarray]], bounds: LoRABounds,
           scale) -> dict[str, LoRAPair]:
    pairs = {}
    for module, h in sorted(halves.items()):
        if set(h) != {"a", "b"}:
            raise _fail(name, f"module {module!r} has lora_{'A' if 'a' in h else 'B'} without its other half")
        a, b = h["a"], h["b"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise _fail(name, f"module {module!r}: A {list(a.shape)} and B {list(b.shape)} do not make a LoRA pair")
        rank = a.shape[0]
        if rank > bounds.max_rank:
            raise _fail(name, f"module {module!r} has rank {rank}, over --max-lora-rank {bounds.max_rank}")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise _fail(name, f"module {module!r} holds non-finite values")
        pairs[module] = LoRAPair(np.ascontiguousarray(a), np.ascontiguousarray(b * np.float32(scale(rank))))
    if not pairs:
        raise _fail(name, "it holds no LoRA matrices")
    return pairs


def _float32(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if dtype not in ("F32", "F16", "F64"):
        raise AdapterError(f"a LoRA matrix of dtype {dtype} is not supported")
    return array.astype(np.float32)
