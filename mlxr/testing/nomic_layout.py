"""nomic-ai's own checkpoint layout (the remote-code one published nomic-embed-text checkpoints
use, and the one llama.cpp's converter reads) written from a transformers 5.x NomicBERT
directory: the same weights with q/k/v fused into Wqkv, nomic's tensor and config names."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

_RENAMES = (("self_attn.o_proj", "attn.out_proj"), ("mlp.up_proj", "mlp.fc11"), ("mlp.gate_proj", "mlp.fc12"),
            ("mlp.down_proj", "mlp.fc2"), ("post_attention_layernorm", "norm1"), ("post_mlp_layernorm", "norm2"))


def nomic_original_dir(native: Path) -> Path:
    """A sibling folder of `native` holding its weights in nomic-ai's layout (written once)."""
    out = native.parent / "nomic-original"
    if (out / ".done").is_file():
        return out
    tmp = Path(tempfile.mkdtemp(dir=native.parent))
    for f in native.iterdir():
        if f.name not in ("model.safetensors", "config.json") and not f.name.startswith("."):
            (shutil.copytree if f.is_dir() else shutil.copy)(f, tmp / f.name)
    _write_weights(native / "model.safetensors", tmp / "model.safetensors")
    (tmp / "config.json").write_text(json.dumps(_config(json.loads((native / "config.json").read_text())), indent=2))
    (tmp / ".done").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return out


def _write_weights(src: Path, dst: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    native, out = load_file(str(src)), {}
    for name, t in native.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            parts = [native[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            out[_layer(name.replace("self_attn.q_proj", "attn.Wqkv"))] = torch.cat(parts).contiguous()
            continue
        for old, new in _RENAMES:
            name = name.replace(old, new)
        out[_layer(name.replace("embeddings.LayerNorm", "emb_ln"))] = t.contiguous()
    save_file(out, str(dst))


def _layer(name: str) -> str:
    return "encoder." + name if name.startswith("layers.") else name


def _config(native: dict) -> dict:
    theta = (native.get("rope_parameters") or {}).get("rope_theta", 1000.0)
    original = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "n_embd": native["hidden_size"],
                "n_head": native["num_attention_heads"], "n_layer": native["num_hidden_layers"],
                "n_inner": native["intermediate_size"], "n_positions": 8192, "max_trained_positions": 2048,
                "rotary_emb_base": theta, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
                "rotary_emb_scale_base": None, "activation_function": "swiglu", "causal": False, "prenorm": False,
                "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
                "layer_norm_epsilon": native.get("layer_norm_eps", 1e-12)}
    # the native keys too, with the same values: a loader reading either finds the same model
    keep = ("vocab_size", "type_vocab_size", "pad_token_id", "hidden_size", "num_attention_heads",
            "num_hidden_layers", "intermediate_size", "layer_norm_eps", "rope_parameters")
    return {**{k: native[k] for k in keep if k in native}, **original}
