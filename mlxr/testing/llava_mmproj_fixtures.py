"""llama.cpp's GGUF and LLaVA-1.5 mmproj GGUF (projector type `mlp`) of the tiny LLaVA fixture.

`convert_hf_to_gguf.py --mmproj` refuses a CLIP tower, so the projector goes through llama.cpp's
legacy route (tools/mtmd/legacy-models/): llava_surgery_v2.py splits the checkpoint into the CLIP
tower and `llava.projector` (pickles, torch.save), then convert_image_encoder_to_gguf.py writes
the mmproj. The split is a rename of tensors, done here into safetensors instead; the encoder
script then reads the projector through safetensors where it calls torch.load (no pickle), and
gets the tower in the layout of transformers 4 that it walks (`model.vision_model.encoder`;
transformers 5's CLIPVisionModel holds the tower's modules itself): the same numbers."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mlxr.testing.llama_cpp_convert import ConverterUnavailable, convert, llama_cpp_tree
from mlxr.testing.vlm_fixtures import vlm_fixture_dir

ENCODER_SCRIPT = "tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py"
# A llama.cpp source tree holding the legacy scripts (the converter's sdist tree lacks them).
SOURCE_ENV = "MLXR_LLAMA_CPP_SRC"
_DRIVER = """
import runpy, sys
root, script = sys.argv.pop(1), sys.argv.pop(1)
sys.path[:0] = [root + "/gguf-py"]
import torch
from safetensors.torch import load_file
torch.load = lambda path, *a, **k: load_file(path)  # the projector is written as safetensors
from transformers import CLIPVisionModel
load_tower = CLIPVisionModel.from_pretrained
def from_pretrained(path, *args, **kwargs):  # transformers 4's layout, which the script walks
    outer = torch.nn.Module()
    outer.vision_model = load_tower(path, *args, **kwargs)
    return outer
CLIPVisionModel.from_pretrained = from_pretrained
sys.argv = [script] + sys.argv[1:]
runpy.run_path(root + "/" + script, run_name="__main__")
"""


def legacy_tree() -> Path:
    tree = Path(os.environ.get(SOURCE_ENV, "/work/lcpp/llama.cpp"))
    if not (tree / ENCODER_SCRIPT).is_file():
        raise ConverterUnavailable(f"no llama.cpp tree with {ENCODER_SCRIPT} (set {SOURCE_ENV})")
    return tree


def split_checkpoint(hf_dir: Path, out: Path) -> tuple[Path, Path]:
    """What llava_surgery_v2.py does, in safetensors: (a CLIPVisionModel directory of the tower,
    the projector's tensors)."""
    from safetensors.numpy import load_file, save_file

    config = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(hf_dir / "model.safetensors")
    tower_dir = out / "clip"
    tower_dir.mkdir(parents=True, exist_ok=True)
    tower = {"vision_model." + k[len("vision_tower."):]: v for k, v in tensors.items() if k.startswith("vision_tower.")}
    save_file(tower, tower_dir / "model.safetensors", metadata={"format": "pt"})
    vision = {**config["vision_config"], "model_type": "clip_vision_model", "architectures": ["CLIPVisionModel"],
              "vision_feature_layer": config.get("vision_feature_layer", -2)}
    (tower_dir / "config.json").write_text(json.dumps(vision, indent=2))
    projector = out / "llava.projector"
    save_file({k: v for k, v in tensors.items() if k.startswith("multi_modal_projector.")}, projector,
              metadata={"format": "pt"})
    return tower_dir, projector


def convert_image_encoder(tree: Path, hf_dir: Path, out: Path) -> Path:
    """hf_dir's tower and projector -> an mmproj GGUF by llama.cpp's legacy encoder script
    (--use-f32: its convolution and projector matrices are stored F16 all the same)."""
    work = out.with_name(f".tmp-{os.getpid()}-{out.stem}")
    shutil.rmtree(work, ignore_errors=True)
    tower_dir, projector = split_checkpoint(hf_dir, work)
    pre = json.loads((hf_dir / "preprocessor_config.json").read_text())
    cmd = [sys.executable, "-c", _DRIVER, str(tree), ENCODER_SCRIPT, "-m", str(tower_dir), "--clip-model-is-vision",
           "--llava-projector", str(projector), "--projector-type", "mlp", "--use-f32", "--output-dir", str(work),
           "--image-mean", *map(str, pre["image_mean"]), "--image-std", *map(str, pre["image_std"])]
    env = {**os.environ, "NO_LOCAL_GGUF": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    written = work / "mmproj-model-f32.gguf"
    if res.returncode != 0 or not written.is_file():
        raise RuntimeError(f"{ENCODER_SCRIPT} failed on {hf_dir}:\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
    shutil.move(written, out)
    shutil.rmtree(work, ignore_errors=True)
    return out


def llama_cpp_llava(root: Path) -> tuple[Path, Path]:
    """(the Llama GGUF, the LLaVA mmproj GGUF) of the tiny LLaVA fixture, written once."""
    hf_dir = vlm_fixture_dir("tiny-llava", root)
    model, mmproj = hf_dir.parent / "llama-cpp-f32.gguf", hf_dir.parent / "llama-cpp-mmproj-mlp-f32.gguf"
    if not mmproj.is_file():
        convert_image_encoder(legacy_tree(), hf_dir, mmproj)
    if not model.is_file():
        convert(llama_cpp_tree(Path(root)), hf_dir, model, "f32")
    return model, mmproj
