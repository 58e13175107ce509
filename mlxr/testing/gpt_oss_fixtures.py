"""The tiny gpt-oss fixture with its experts in MXFP4, as OpenAI's released checkpoints hold them:
`gate_up_proj_blocks` / `_scales` and `down_proj_blocks` / `_scales` in place of the float experts,
and config.json's quantization_config {"quant_method": "mxfp4"} (what llama.cpp's converter reads
to repack them as GGUF MXFP4). Beside it, the same model with every expert weight replaced by the
dequantized value of its blocks, in float32 (transformers' reference: the numbers the blocks hold).

The codes are gguf-py's MXFP4 quantization of the float fixture's experts, rewritten in OpenAI's
packing (two codes a byte, element 2j low, 2j + 1 high; scales separate)."""
from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import numpy as np

from mlxr.testing.arch_fixtures import ARCH_FIXTURES, arch_fixture_dir
from mlxr.testing.write_once import write_once

NAME = "tiny-gpt_oss"


def harmony_fixture_dir(root: Path) -> Path:
    """tiny-gpt_oss with a tokenizer holding harmony's special tokens and a harmony template
    (fixture_tokenizer.HARMONY), for the servers' harmony replies."""
    from mlxr.testing import fixture_tokenizer as ft
    from mlxr.testing.arch_fixtures import ArchFixture

    base = ARCH_FIXTURES[NAME]
    eos = [ft.HARMONY.specials.index(t) for t in ft.HARMONY.eos]
    spec = ArchFixture({**base.config, "bos_token_id": eos[0], "eos_token_id": eos, "max_position_embeddings": 1024},
                       ft.HARMONY, base.seed)
    return arch_fixture_dir(f"{NAME}-harmony", root, spec)


def openai_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[..., out, in] float -> (blocks [..., out, in / 32, 16], scales [..., out, in / 32], the
    dequantized weight) from gguf-py's MXFP4."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    flat = w.reshape(-1, w.shape[-1]).astype(np.float32)
    raw = quantize(flat, GGMLQuantizationType.MXFP4).reshape(*w.shape[:-1], w.shape[-1] // 32, 17)
    low, high = raw[..., 1:] & 0x0F, raw[..., 1:] >> 4
    codes = np.concatenate([low, high], axis=-1)  # elements 0..31 of each block
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    deq = dequantize(raw.reshape(flat.shape[0], -1), GGMLQuantizationType.MXFP4).reshape(w.shape)
    return blocks, np.ascontiguousarray(raw[..., 0]), deq


def mxfp4_fixture_dirs(root: Path) -> tuple[Path, Path]:
    """(the MXFP4 HF directory, its dequantized float32 twin), written once under root (the name
    carries a hash of the float fixture's config)."""
    tag = zlib.crc32(json.dumps(ARCH_FIXTURES[NAME].config, sort_keys=True).encode())
    final = Path(root) / f"{NAME}-mxfp4-{tag:08x}-v1"
    write_once(final, lambda tmp: _write(arch_fixture_dir(NAME, root), tmp), f"{NAME}-mxfp4")
    return final / "hf", final / "hf-dequantized"


def _write(src: Path, out: Path) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    packed, dequantized = {}, {}
    for name, value in tensors.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            packed[name] = dequantized[name] = value
            continue
        blocks, scales, deq = openai_mxfp4(np.swapaxes(value, 1, 2))  # HF [E, in, out] -> [E, out, in]
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
        dequantized[name] = np.ascontiguousarray(np.swapaxes(deq, 1, 2))
    config = json.loads((src / "config.json").read_text())
    for sub, weights, cfg in (("hf", packed, {**config, "quantization_config": {"quant_method": "mxfp4"}}),
                              ("hf-dequantized", dequantized, config)):
        shutil.copytree(src, out / sub, ignore=shutil.ignore_patterns("*.safetensors", "config.json", "*.gguf"))
        save_file(weights, str(out / sub / "model.safetensors"), metadata={"format": "pt"})
        (out / sub / "config.json").write_text(json.dumps(cfg, indent=2))
