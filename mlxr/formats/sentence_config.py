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
class SentenceConfig:
    pooling: str | None  # "mean" | "cls" | "last"; None: the directory does not say
    normalize: bool  # a Normalize module follows the pooling


def read_sentence_config(root: Path) -> SentenceConfig:
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return SentenceConfig(None, False)
    modules = read_json(modules_file, _MAX_JSON)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelFormatError("modules.json must hold a list of objects")
    types = [str(m.get("type", "")) for m in modules]
    if any(t.endswith("Dense") for t in types):
        raise UnsupportedModelError("sentence-transformers Dense modules are not supported")
    pooling = None
    for module, kind in zip(modules, types):
        if kind.endswith("Pooling"):
            pooling = _pooling_mode(root / _module_dir(module))
    return SentenceConfig(pooling, any(t.endswith("Normalize") for t in types))


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
