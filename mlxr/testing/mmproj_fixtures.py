"""llama.cpp's GGUF and mmproj GGUF of the vision fixtures, written by its own converter
(`convert_hf_to_gguf.py` and `convert_hf_to_gguf.py --mmproj`).

transformers 5 saves a tower's tensors below `vision_tower.`; the converter's name table knows
the layout transformers 4 saved, the one published checkpoints have (`vision_tower.vision_model.`),
so the converter reads a copy of the fixture in that layout (the same numbers), whose
preprocessor_config.json also says the image's token count as published Gemma 3 files do
(`image_seq_length`, from which the converter writes a projector merge other than its default)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mlxr.testing.llama_cpp_convert import convert, llama_cpp_tree
from mlxr.testing.vlm_fixtures import vlm_fixture_dir


def published_layout(hf_dir: Path) -> Path:
    """A copy of hf_dir beside it whose tower tensors sit below `vision_tower.vision_model.`."""
    from safetensors.numpy import load_file, save_file

    out = Path(hf_dir).parent / "hf-published-layout"
    if out.is_dir():
        return out
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    shutil.copytree(hf_dir, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((tmp / "config.json").read_text())
    if "mm_tokens_per_image" in config:
        pre = json.loads((tmp / "preprocessor_config.json").read_text())
        pre["image_seq_length"] = config["mm_tokens_per_image"]
        (tmp / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    tensors = load_file(Path(hf_dir) / "model.safetensors")
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
               for k, v in tensors.items()}
    save_file(renamed, tmp / "model.safetensors", metadata={"format": "pt"})
    os.rename(tmp, out)
    return out


def llama_cpp_vlm(name: str, root: Path, outtype: str = "f32") -> tuple[Path, Path]:
    """(the language model's GGUF, the mmproj GGUF) of a vision fixture, written once."""
    source = published_layout(vlm_fixture_dir(name, root))
    tree = llama_cpp_tree(Path(root))
    model, mmproj = source.parent / f"llama-cpp-{outtype}.gguf", source.parent / f"llama-cpp-mmproj-{outtype}.gguf"
    if not model.is_file():
        convert(tree, source, model, outtype)
    if not mmproj.is_file():
        convert(tree, source, mmproj, outtype, flags=("--mmproj",), bpe_vocab=False)  # a projector has no vocabulary
    return model, mmproj
