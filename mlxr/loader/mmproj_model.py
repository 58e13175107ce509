"""A language model's GGUF with llama.cpp's mmproj GGUF beside it -> the vision model's args and
the tower's and projector's weights under our parameter names (formats/mmproj.py reads the file)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import GGUFFile, open_gguf
from mlxr.formats.mmproj import PLUS_ONE, check_pairing, read_mmproj
from mlxr.model_config import ModelArgs, VisionArgs
from mlxr.models import canonical_model_type
from mlxr.tokenizer.tokenizer import Tokenizer

# The prompt's image tokens, as the HF processor of each projector's model writes them.
IMAGE_TOKENS = {
    "gemma3": {"image_marker": "<start_of_image>", "image_sequence": "\n\n<start_of_image>{image}<end_of_image>\n\n",
               "image_token": "<image_soft_token>", "bidirectional": True},
    "idefics3": {"image_marker": "<image>", "image_sequence": "{image}", "image_token": "<image>"},
    "llava": {"image_marker": "<image>", "image_sequence": "{image}", "image_token": "<image>"},
    "qwen2_5_vl": {"image_marker": "<|vision_start|><|image_pad|><|vision_end|>",
                   "image_sequence": "<|vision_start|>{image}<|vision_end|>", "image_token": "<|image_pad|>"},
}


def with_projector(args: ModelArgs, tokenizer: Tokenizer, path: Path,
                   weights: bool = True) -> tuple[ModelArgs, Iterator[tuple[str, torch.Tensor]]]:
    """args with the mmproj file's VisionArgs, and (when weights) its tensors as they load."""
    f = open_gguf(path)
    try:
        vision = read_mmproj(f)
        check_pairing(vision, Path(path).name, canonical_model_type(args.model_type), args.hidden_size)
        tokens = IMAGE_TOKENS[vision.fields["projector"]]
        image_token_id = tokenizer.token_to_id(tokens["image_token"])
        if image_token_id is None:
            raise ModelFormatError(f"the model's vocabulary lacks {tokens['image_token']}, which its projector "
                                   f"{Path(path).name} needs")
        rope = _text_rope(args, vision.fields["projector"], path)
    except BaseException:
        f.close()
        raise
    args = replace(args, vision=VisionArgs(**vision.fields, **tokens, **rope, image_token_id=image_token_id))
    if not weights:
        f.close()
        return args, iter(())
    return args, _tensors(f, vision.tensor_names, vision.fields["tower"], vision.joined)


def _text_rope(args: ModelArgs, projector: str, path: Path) -> dict:
    """The language model's M-RoPE sections (its GGUF's rope.dimension_sections) for a tower that needs them."""
    if projector != "qwen2_5_vl":
        return {}
    section = args.extra.get("mrope_section")
    if not section:
        raise ModelFormatError(f"{Path(path).name} is a Qwen2.5-VL projector; its language model's GGUF gives no "
                               "M-RoPE sections (qwen2vl.rope.dimension_sections)")
    return {"mrope_section": section}


def _tensors(f: GGUFFile, names: dict[str, str], tower: str,
             joined: dict[str, tuple[tuple[str, ...], int]]) -> Iterator[tuple[str, torch.Tensor]]:
    with f:
        for ours, (theirs, axis) in joined.items():
            parts = [np.asarray(f.load(n), dtype=np.float32) for n in theirs]
            array = np.concatenate(parts) if axis == 0 else np.stack(parts, axis=axis)
            yield ours, torch.from_numpy(np.ascontiguousarray(array))
        if tower == "clip":  # the norm of CLIP's pooled output, which LLaVA never reads: the file drops it
            width = f.tensor_info("v.pre_ln.weight").shape[0]
            yield "vision_tower.post_layernorm.weight", torch.ones(width)
            yield "vision_tower.post_layernorm.bias", torch.zeros(width)
        for theirs, ours in names.items():
            array = np.asarray(f.load(theirs), dtype=np.float32)
            if theirs in PLUS_ONE:
                array = array - 1.0
            yield ours, torch.from_numpy(np.ascontiguousarray(array))
