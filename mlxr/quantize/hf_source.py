"""A Hugging Face model directory (config.json, safetensors, tokenizer.json) as a
quantizer source, converted to GGUF names and layouts on the fly."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
from safetensors import SafetensorError, safe_open

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.json_file import read_json_object
from mlxr.formats.safetensors_dir import RawTensor, iter_safetensors, shard_files
from mlxr.quantize.hf_convert import HFToGGUF
from mlxr.quantize.hf_tokenizer import add_hf_tokenizer
from mlxr.quantize.source import SourceTensor

_FLOAT_DTYPES = ("F32", "F16", "BF16")
_MAX_CONFIG_BYTES = 1 << 20


class HFSource:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conv = HFToGGUF(_read_config(root / "config.json"))
        self.arch = self.conv.arch_name
        self._extras = self.conv.extra_tensors()
        self.tensors = self._plan() + [SourceTensor(n, a.shape) for n, a in self._extras]

    def _plan(self) -> list[SourceTensor]:
        """Names and shapes from the safetensors headers, in the order arrays() reads them."""
        planned: list[SourceTensor] = []
        for path in shard_files(self.root):
            try:
                with safe_open(path, framework="numpy") as f:
                    for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                        sl = f.get_slice(key)
                        planned += self._planned(key, sl.get_dtype(), tuple(sl.get_shape()))
            except SafetensorError as e:
                raise ModelFormatError(f"{path.name} is not a valid safetensors file: {e}") from None
        return planned

    def _planned(self, key: str, dtype: str, shape: tuple[int, ...]) -> list[SourceTensor]:
        name = self.conv.gguf_name(key)
        if name is None:
            return []
        if dtype not in _FLOAT_DTYPES:
            raise UnsupportedModelError(f"tensor {key!r} has dtype {dtype}; only F32, F16 and BF16 can be quantized")
        return [SourceTensor(name, shape)]

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        w.add_name(self.root.name)
        self.conv.write_hparams(w)
        add_hf_tokenizer(w, self.root, self.conv.args.vocab_size)

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        for raw in iter_safetensors(self.root):
            name = self.conv.gguf_name(raw.name)
            if name is not None:
                yield name, self.conv.convert(raw.name, _float32(raw))
        yield from self._extras

    def close(self) -> None:
        pass


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise ModelFormatError(f"{path.parent} has no config.json")
    return read_json_object(path, _MAX_CONFIG_BYTES)


def _float32(raw: RawTensor) -> np.ndarray:
    if raw.dtype == "BF16":  # raw bits: bfloat16 is the top half of a float32
        return (raw.array.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw.array.astype(np.float32, copy=False)
