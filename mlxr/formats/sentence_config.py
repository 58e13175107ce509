"""A sentence-transformers model directory's pooling: modules.json, its Pooling module's
config.json (the old `pooling_mode_*_token` flags or the newer `pooling_mode` name) and whether a
Normalize module follows. Torch-free; the pooling math is models/pooling.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.json_file import read_json, read_json_object

_MAX_JSON = 1 << 20
# Pooling config flags (old form) and names (new form) -> llama.cpp's --pooling names.
_FLAGS = (("pooling_mode_cls_token", "cls"), ("pooling_mode_mean_tokens", "mean"),
          ("pooling_mode_lasttoken", "last"))
_NAMES = {"cls": "cls", "mean": "mean", "lasttoken": "last", "last": "last"}


@dataclass(frozen=True)
class DenseModule:
    """A sentence-transformers Dense module after the pooling: its folder (model.safetensors
    holds `linear.weight` and maybe `linear.bias`), its sizes and activation."""

    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # "identity" | "tanh"


@dataclass(frozen=True)
class SentenceConfig:
    pooling: str | None  # "mean" | "cls" | "last"; None: the directory does not say
    normalize: bool  # a Normalize module follows the pooling
    dense: tuple[DenseModule, ...] = ()  # Dense modules between the pooling and Normalize, in order


# sentence-transformers' activation_function values -> ours
_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh"}
_MAX_FEATURES = 1 << 16


def read_sentence_config(root: Path) -> SentenceConfig:
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return SentenceConfig(None, False)
    modules = read_json(modules_file, _MAX_JSON)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelFormatError("modules.json must hold a list of objects")
    types = [str(m.get("type", "")) for m in modules]
    pooling, dense = None, []
    for module, kind in zip(modules, types):
        if kind.endswith("Pooling"):
            pooling = _pooling_mode(root / _module_dir(module))
        elif kind.endswith("Dense"):
            dense.append(_dense(root, _module_dir(module)))
    return SentenceConfig(pooling, any(t.endswith("Normalize") for t in types), tuple(dense))


def _dense(root: Path, path: str) -> DenseModule:
    cfg = read_json_object(root / path / "config.json", _MAX_JSON)
    sizes = [cfg.get(k) for k in ("in_features", "out_features")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= _MAX_FEATURES for n in sizes):
        raise ModelFormatError(f"{path}/config.json: in_features and out_features must be integers in "
                               f"1..{_MAX_FEATURES}, got {sizes}")
    act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if act not in _ACTIVATIONS:
        raise UnsupportedModelError(f"{path}: Dense activation {act!r} is not supported (Identity, Tanh)")
    return DenseModule(path, sizes[0], sizes[1], cfg.get("bias", True) is not False, _ACTIVATIONS[act])


def _module_dir(module: dict) -> str:
    path = module.get("path")
    if not isinstance(path, str) or path.startswith("/") or ".." in Path(path).parts:
        raise ModelFormatError(f"modules.json path {path!r} must be a folder inside the model directory")
    return path


def _pooling_mode(folder: Path) -> str:
    cfg = read_json_object(folder / "config.json", _MAX_JSON)
    name = cfg.get("pooling_mode")
    if isinstance(name, str):
        if name not in _NAMES:
            raise UnsupportedModelError(f"pooling mode {name!r} is not supported (cls, mean, lasttoken)")
        return _NAMES[name]
    chosen = [mode for flag, mode in _FLAGS if cfg.get(flag)]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in dict(_FLAGS)]
    if len(chosen) != 1 or others:
        raise UnsupportedModelError(f"pooling {sorted(k for k, v in cfg.items() if k.startswith('pooling_mode') and v)}"
                                    " is not supported: one of cls, mean, lasttoken")
    return chosen[0]
