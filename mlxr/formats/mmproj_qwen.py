"""Qwen2.5-VL's mmproj (`clip.projector_type` qwen2.5vl_merger, as `convert_hf_to_gguf.py --mmproj`
writes it) -> the tower's VisionArgs fields and its tensors in models/vision/qwen_vit.py's terms.

What the file does not say is read as llama.cpp's clip.cpp reads it: a 2 x 2 merge
(clip.vision.spatial_merge_size where given), windows of 112 pixels (clip.vision.window_size where
given; the converter writes none for Qwen2.5-VL, and 112 is every published checkpoint's), full
attention in the layers i with (i + 1) % n_wa_pattern == 0, the tower's rotary theta 10000. The
converter keeps no processor numbers but the mean and std, so images are resized with
transformers' defaults (56 x 56 .. 28 x 28 x 1280 pixels)."""
from __future__ import annotations

from mlxr.model_config import ImagePreprocess
from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import GGUFFile
from mlxr.formats.mmproj_values import meta_eps, meta_int, meta_triple

DEFAULT_WINDOW = 112  # clip.cpp's attn_window_size where the file has none
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280  # transformers' Qwen2VLImageProcessor defaults
_MAX_SIDE, _MAX_LAYERS, _MAX_WIDTH = 8192, 256, 1 << 16
_TEMPORAL = 2  # the converter splits the Conv3d's two frames into two 2D kernels (it allows only 2)

_LAYER_TENSORS = {
    "ln1.weight": "norm1.weight", "ln2.weight": "norm2.weight",
    "attn_out.weight": "attn.proj.weight", "attn_out.bias": "attn.proj.bias",
    **{f"ffn_{p}.{part}": f"mlp.{p}_proj.{part}" for p in ("gate", "up", "down") for part in ("weight", "bias")},
}
_ONCE = {"v.post_ln.weight": "visual.merger.ln_q.weight",
         **{f"mm.{i}.{part}": f"visual.merger.mlp.{i}.{part}" for i in (0, 2) for part in ("weight", "bias")}}


def qwen_mmproj(f: GGUFFile, where: str) -> tuple[dict, int, dict[str, str], dict[str, tuple[tuple[str, ...], int]]]:
    """(VisionArgs fields less the text model's M-RoPE sections, projection width, 1:1 tensor names,
    joined tensors: ours -> (theirs, how: 0 concatenated by rows, 2 stacked as a new axis 2))."""
    get = lambda key, top, default=None: meta_int(f, where, f"clip.vision.{key}", top, default)  # noqa: E731
    hidden, heads, layers = get("embedding_length", _MAX_WIDTH), get("attention.head_count", 1024), \
        get("block_count", _MAX_LAYERS)
    patch, merge = get("patch_size", _MAX_SIDE), get("spatial_merge_size", 16, 2)
    if hidden % heads or (hidden // heads) % 4:
        raise ModelFormatError(f"{where}: embedding_length {hidden} does not split into {heads} heads whose width "
                               "is a multiple of 4 (the tower's 2D rotary)")
    if f.metadata.get("clip.use_silu") is not True:
        raise ModelFormatError(f"{where}: a qwen2.5vl_merger tower must say clip.use_silu true (its MLP is SiLU-gated)")
    window = get("window_size", _MAX_SIDE, DEFAULT_WINDOW)
    if window % (patch * merge):
        raise ModelFormatError(f"{where}: window_size {window} is not a whole number of {patch * merge}-pixel tokens")
    factor = patch * merge
    preprocess = ImagePreprocess(height=factor, width=factor, resize_factor=factor, min_pixels=MIN_PIXELS,
                                 max_pixels=MAX_PIXELS, resample=3,
                                 image_mean=meta_triple(f, where, "clip.vision.image_mean"),
                                 image_std=meta_triple(f, where, "clip.vision.image_std"))
    fields = {
        "tower": "qwen2_5_vl", "projector": "qwen2_5_vl", "hidden_size": hidden, "num_attention_heads": heads,
        "intermediate_size": get("feed_forward_length", _MAX_WIDTH * 8), "num_hidden_layers": layers,
        "image_size": 0, "patch_size": patch, "tokens_per_image": 0, "layer_norm_eps": meta_eps(f, where),
        "hidden_act": "silu", "scale_factor": merge, "temporal_patch_size": _TEMPORAL, "window_size": window,
        "full_attention_layers": _full_attention(f, where, layers), "rope_theta": 10000.0, "preprocess": preprocess,
    }
    names, joined = _tensor_names(layers)
    missing = [n for n in [*names, *(t for parts, _ in joined.values() for t in parts)] if n not in f]
    if missing:
        raise ModelFormatError(f"{where} lacks tensors: {', '.join(missing[:5])}")
    width = hidden * merge * merge
    out = f.tensor_info("mm.2.weight").shape[0]
    want = {"v.patch_embd.weight": (hidden, 3, patch, patch), "v.patch_embd.weight.1": (hidden, 3, patch, patch),
            "v.blk.0.attn_q.weight": (hidden, hidden), "v.blk.0.ffn_up.weight": (fields["intermediate_size"], hidden),
            "mm.0.weight": (width, width), "mm.2.weight": (out, width)}
    for name, shape in want.items():
        got = tuple(f.tensor_info(name).shape)
        if got != shape:
            raise ModelFormatError(f"{where}: tensor {name} has shape {got}, expected {shape}")
    return fields, out, names, joined


def _full_attention(f: GGUFFile, where: str, layers: int) -> tuple[int, ...]:
    """clip.cpp's rule for qwen2.5vl_merger (it reads no explicit list for this projector)."""
    pattern = meta_int(f, where, "clip.vision.n_wa_pattern", layers)
    return tuple(i for i in range(layers) if (i + 1) % pattern == 0)


def _tensor_names(layers: int) -> tuple[dict[str, str], dict[str, tuple[tuple[str, ...], int]]]:
    frames = ("v.patch_embd.weight", "v.patch_embd.weight.1")  # the Conv3d's kernel at t = 0 and t = 1
    names, joined = dict(_ONCE), {"visual.patch_embed.proj.weight": (frames, 2)}
    for i in range(layers):
        names |= {f"v.blk.{i}.{theirs}": f"visual.blocks.{i}.{ours}" for theirs, ours in _LAYER_TENSORS.items()}
        for part in ("weight", "bias"):
            joined[f"visual.blocks.{i}.attn.qkv.{part}"] = (tuple(f"v.blk.{i}.attn_{x}.{part}" for x in "qkv"), 0)
    return names, joined
