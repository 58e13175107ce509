"""Typed reads of an mmproj file's `clip.*` metadata; every bad value names its key."""
from __future__ import annotations

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import GGUFFile


def meta_int(f: GGUFFile, where: str, key: str, top: int, default: int | None = None) -> int:
    value = f.metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
        raise ModelFormatError(f"{where}: {key} must be an integer in 1..{top}, got {value!r}")
    return value


def meta_eps(f: GGUFFile, where: str) -> float:
    value = f.metadata.get("clip.vision.attention.layer_norm_epsilon", 1e-6)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ModelFormatError(f"{where}: clip.vision.attention.layer_norm_epsilon must be in (0, 1), got {value!r}")
    return float(value)


def meta_triple(f: GGUFFile, where: str, key: str) -> tuple[float, float, float]:
    value = f.metadata.get(key, [0.5, 0.5, 0.5])
    ok = isinstance(value, list) and len(value) == 3 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    if not ok or (key.endswith("std") and min(value) <= 0):
        raise ModelFormatError(f"{where}: {key} must be three numbers{' above 0' if key.endswith('std') else ''}, "
                               f"got {value!r}")
    return (float(value[0]), float(value[1]), float(value[2]))
