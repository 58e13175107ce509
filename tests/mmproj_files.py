"""Altered copies of llama.cpp's mmproj file for the refusal tests: metadata changed or tensors
dropped or reshaped, rewritten with gguf-py's GGUFWriter (the writer llama.cpp's converter uses)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

_SKIPPED = ("GGUF.", "general.alignment")


def rewrite(src: Path, out: Path, metadata: dict | None = None, drop: tuple[str, ...] = (),
            shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """src with `metadata` keys replaced or added (None removes one), `drop` tensors left out and
    `shapes` tensors replaced by zeros of another shape."""
    import gguf

    from mlxr.formats.gguf import open_gguf

    metadata, shapes = metadata or {}, shapes or {}
    with open_gguf(src) as f:
        values = {k: v for k, v in f.metadata.items() if not k.startswith(_SKIPPED)}
        tensors = {n: (np.zeros(shapes[n], np.float32) if n in shapes else f.load(n))
                   for n in f.tensor_names if n not in drop}
    values.update(metadata)
    writer = gguf.GGUFWriter(str(out), arch=str(values.pop("general.architecture", "clip")))
    for key, value in values.items():
        if value is not None:
            _add(writer, key, value)
    for name, array in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add(writer, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))
