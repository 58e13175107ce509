"""llama.cpp's mmproj GGUF (a vision tower and its projector, as `convert_hf_to_gguf.py --mmproj`
writes it) -> the tower's shape, its tensors' names in our models' terms, and the checks that
refuse a malformed file with the reason. Torch-free: the registry checks a file at import."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import GGUFFile, open_gguf
from mlxr.formats.hf_preprocess import TILE_SIDES
from mlxr.formats.mmproj_qwen import qwen_mmproj
from mlxr.formats.mmproj_values import meta_eps, meta_int, meta_triple
from mlxr.model_config import ImagePreprocess, ImageTiling

# clip.projector_type -> (our projector, the tower, the text architectures it feeds: canonical
# names and GGUF ones). `mlp`: LLaVA 1.5's, as llama.cpp's legacy convert_image_encoder_to_gguf.py
# writes it; `qwen2.5vl_merger`: formats/mmproj_qwen.py reads it.
PROJECTORS = {"gemma3": ("gemma3", "siglip", ("gemma3",)), "idefics3": ("idefics3", "idefics3", ("llama",)),
              "mlp": ("llava", "clip", ("llama",)),
              "qwen2.5vl_merger": ("qwen2_5_vl", "qwen2_5_vl", ("qwen2_5_vl", "qwen2vl"))}
GEMMA3_MERGE = 4  # llama.cpp's default patch merge a side for Gemma 3 (clip.vision.projector.scale_factor)
# clip.vision.projector.scale_factor where absent: Gemma 3's pooling, Idefics3's pixel shuffle
_MERGE = {"gemma3": GEMMA3_MERGE, "idefics3": 2, "llava": 1}
_MAX_SIDE = 8192
_MAX_LAYERS = 256
_MAX_WIDTH = 1 << 16

# mmproj tensor -> parameter below the model, per encoder layer ("{i}") or once.
_LAYER_TENSORS = {
    "ln1": "layer_norm1", "ln2": "layer_norm2", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
}
_TOWER_TENSORS = {
    "v.patch_embd.weight": "vision_tower.embeddings.patch_embedding.weight",
    "v.patch_embd.bias": "vision_tower.embeddings.patch_embedding.bias",
    "v.position_embd.weight": "vision_tower.embeddings.position_embedding.weight",
    "v.post_ln.weight": "vision_tower.post_layernorm.weight",
    "v.post_ln.bias": "vision_tower.post_layernorm.bias",
}
# CLIP (LLaVA): a class token and a norm before the encoder; its pooled output's norm is dropped.
_CLIP_TOWER_TENSORS = {
    "v.class_embd": "vision_tower.embeddings.class_embedding",
    "v.patch_embd.weight": "vision_tower.embeddings.patch_embedding.weight",
    "v.position_embd.weight": "vision_tower.embeddings.position_embedding.weight",
    "v.pre_ln.weight": "vision_tower.pre_layrnorm.weight", "v.pre_ln.bias": "vision_tower.pre_layrnorm.bias",
}
# The legacy encoder script names CLIP's fc1 ffn_down and fc2 ffn_up (convert_hf_to_gguf.py the other way).
_LEGACY_FFN = {"ffn_down": "mlp.fc1", "ffn_up": "mlp.fc2"}
_PROJECTOR_TENSORS = {
    "gemma3": {"mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
               "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight"},
    "idefics3": {"mm.model.fc.weight": "multi_modal_projector.modality_projection.proj.weight"},
    "llava": {"mm.0.weight": "multi_modal_projector.linear_1.weight", "mm.0.bias": "multi_modal_projector.linear_1.bias",
              "mm.2.weight": "multi_modal_projector.linear_2.weight", "mm.2.bias": "multi_modal_projector.linear_2.bias"},
}
# Stored as llama.cpp computes with it: Gemma's RMS norm weight with its 1 added (ours adds it).
PLUS_ONE = frozenset({"mm.soft_emb_norm.weight"})


@dataclass(frozen=True)
class MmprojVision:
    """The VisionArgs fields an mmproj file gives (the image tokens come from the text model)."""

    fields: dict
    projection_dim: int
    text_architectures: tuple[str, ...]
    tensor_names: dict[str, str]  # mmproj tensor -> our parameter name
    # our parameter -> (mmproj tensors, axis): concatenated along it (0) or stacked as a new one (2)
    joined: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)


def read_mmproj(f: GGUFFile) -> MmprojVision:
    """The tower and projector an open mmproj file describes; ModelFormatError names what is wrong."""
    where = f.path.name
    arch = f.metadata.get("general.architecture")
    if arch != "clip":
        raise ModelFormatError(f"{where} is not an mmproj file: general.architecture is {arch!r}, expected 'clip'")
    if f.metadata.get("clip.has_vision_encoder") is not True:
        raise ModelFormatError(f"{where} has no vision encoder (clip.has_vision_encoder is not true)")
    kind = f.metadata.get("clip.projector_type")
    if kind not in PROJECTORS:
        raise ModelFormatError(f"{where}: projector type {kind!r} is not supported (supported: {', '.join(PROJECTORS)})")
    projector, tower, text_archs = PROJECTORS[kind]
    if projector == "qwen2_5_vl":
        fields, width, names, joined = qwen_mmproj(f, where)
        return MmprojVision(fields, width, text_archs, names, joined)
    get = lambda key, top: meta_int(f, where, f"clip.vision.{key}", top)  # noqa: E731
    hidden, heads = get("embedding_length", _MAX_WIDTH), get("attention.head_count", 1024)
    image, patch, layers = get("image_size", _MAX_SIDE), get("patch_size", _MAX_SIDE), get("block_count", _MAX_LAYERS)
    merge = 1 if projector == "llava" else meta_int(f, where, "clip.vision.projector.scale_factor", _MAX_SIDE,
                                                    _MERGE[projector])
    side = image // patch
    if image % patch or side % merge:
        raise ModelFormatError(f"{where}: image_size {image} is not a whole number of {patch}-pixel patches "
                               f"merged {merge} a side")
    if hidden % heads:
        raise ModelFormatError(f"{where}: embedding_length {hidden} does not split into {heads} heads")
    normalise = {"image_mean": meta_triple(f, where, "clip.vision.image_mean"),
                 "image_std": meta_triple(f, where, "clip.vision.image_std")}
    fields = {
        "tower": tower, "projector": projector, "hidden_size": hidden, "num_attention_heads": heads,
        "intermediate_size": get("feed_forward_length", _MAX_WIDTH * 8), "num_hidden_layers": layers,
        "image_size": image, "patch_size": patch, "tokens_per_image": (side // merge) ** 2,
        "layer_norm_eps": meta_eps(f, where), "hidden_act": "gelu_pytorch_tanh",
        "preprocess": ImagePreprocess(height=image, width=image, resample=2, **normalise),
    }
    if projector == "idefics3":
        fields |= _idefics3_fields(f, where, image, merge, normalise)
    if projector == "llava":
        fields |= _llava_fields(f, where, layers, image, normalise)
    names = _tensor_names(projector, tower, layers)
    missing = [n for n in names if n not in f]
    if missing:
        raise ModelFormatError(f"{where} lacks tensors: {', '.join(missing[:5])}")
    _check_shapes(f, where, fields)
    return MmprojVision(fields, _projection_dim(f, where, projector), text_archs, names)


def _llava_fields(f: GGUFFile, where: str, layers: int, image: int, normalise: dict) -> dict:
    """LLaVA 1.5: every patch a token (the class token's row dropped), read at the feature layer
    (the script keeps the blocks up to it: block_count); CLIP's processor (the shortest edge, a
    centre crop, bicubic)."""
    chosen = f.metadata.get("clip.vision.feature_layer", [layers])
    ok = isinstance(chosen, list) and len(chosen) == 1 and isinstance(chosen[0], int) and 0 < chosen[0] <= layers
    if not ok:
        raise ModelFormatError(f"{where}: clip.vision.feature_layer must be one layer in 1..{layers}, got {chosen!r}")
    return {"feature_layer": chosen[0], "hidden_act": "gelu" if f.metadata.get("clip.use_gelu") is True else "quick_gelu",
            "preprocess": ImagePreprocess(height=image, width=image, shortest_edge=image, resample=3, **normalise)}


def _projection_dim(f: GGUFFile, where: str, projector: str) -> int:
    if projector == "llava":  # clip.vision.projection_dim is CLIP's own; the MLP's output is the model's
        return f.tensor_info("mm.2.weight").shape[0]
    return meta_int(f, where, "clip.vision.projection_dim", _MAX_WIDTH)


def _idefics3_fields(f: GGUFFile, where: str, image: int, merge: int, normalise: dict) -> dict:
    """Idefics3's tiles: the longest edge the converter stores (clip.vision.preproc_image_size, the
    processor's size.longest_edge), tiles of the tower's size, transformers' LANCZOS resizes."""
    longest = meta_int(f, where, "clip.vision.preproc_image_size", _MAX_SIDE, image)
    if -(-longest // image) > TILE_SIDES:
        raise ModelFormatError(f"{where}: clip.vision.preproc_image_size {longest} makes more than "
                               f"{TILE_SIDES} tiles of {image} a side")
    tiling = ImageTiling(longest_edge=longest, tile=image)
    return {"preprocess": ImagePreprocess(height=image, width=image, resample=1, tiling=tiling, **normalise),
            "tiled": True, "scale_factor": merge}


def check_mmproj(path: Path, text_architecture: str, text_hidden: int) -> MmprojVision:
    """An mmproj file that fits the language model it is imported with (the registry's check)."""
    with open_gguf(path) as f:
        vision = read_mmproj(f)
    check_pairing(vision, Path(path).name, text_architecture, text_hidden)
    return vision


def check_pairing(vision: MmprojVision, where: str, text_architecture: str, text_hidden: int) -> None:
    if text_architecture not in vision.text_architectures:
        raise ModelFormatError(f"{where} is a {vision.fields['projector']} projector; the model is {text_architecture}")
    if vision.projection_dim != text_hidden:
        raise ModelFormatError(f"{where} projects into {vision.projection_dim} dimensions; the model's embeddings "
                               f"have {text_hidden}")


def _tensor_names(projector: str, tower: str, layers: int) -> dict[str, str]:
    names = dict(_CLIP_TOWER_TENSORS if tower == "clip" else _TOWER_TENSORS)
    per_layer = _LAYER_TENSORS | (_LEGACY_FFN if tower == "clip" else {})
    for i in range(layers):
        for ours, theirs in per_layer.items():
            for part in ("weight", "bias"):
                names[f"v.blk.{i}.{ours}.{part}"] = f"vision_tower.encoder.layers.{i}.{theirs}.{part}"
    return names | _PROJECTOR_TENSORS[projector]


def _check_shapes(f: GGUFFile, where: str, v: dict) -> None:
    d, patches = v["hidden_size"], (v["image_size"] // v["patch_size"]) ** 2
    positions = patches + (1 if v["tower"] == "clip" else 0)  # CLIP's class token has a position too
    want = {"v.patch_embd.weight": (d, 3, v["patch_size"], v["patch_size"]), "v.position_embd.weight": (positions, d)}
    for name, shape in want.items():
        got = f.tensor_info(name).shape
        if tuple(got) != shape:
            raise ModelFormatError(f"{where}: tensor {name} has shape {tuple(got)}, expected {shape}")
