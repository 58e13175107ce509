"""Draft-head fixtures for a tiny target: an EAGLE-3 head directory in the published layout
(config.json, model.safetensors with fc, midlayer.*, norm, lm_head, d2t, t2d) and a copy of the
target whose checkpoint carries an MTP layer in Qwen3-Next's layout (mtp.*). Random weights,
or trained (head_training.py) to copy the target."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import safetensors.numpy

EAGLE3_AUX_LAYERS = (0, 1, 1)  # of a 2-layer target: the embeddings' stream, then the middle one twice


def _target_config(target_dir: Path) -> dict:
    return json.loads((Path(target_dir) / "config.json").read_text())


def eagle3_config(target: dict, draft_vocab_size: int, aux=EAGLE3_AUX_LAYERS) -> dict:
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "rope_theta", "vocab_size", "hidden_act", "max_position_embeddings")
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **{k: target[k] for k in keys},
            "num_hidden_layers": 1, "draft_vocab_size": draft_vocab_size, "target_hidden_size": target["hidden_size"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux)}}


def eagle3_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    h, nh, kv, hd, ff = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                         c["intermediate_size"])
    m = "midlayer."
    return {"fc.weight": (h, 3 * c["target_hidden_size"]), m + "self_attn.q_proj.weight": (nh * hd, 2 * h),
            m + "self_attn.k_proj.weight": (kv * hd, 2 * h), m + "self_attn.v_proj.weight": (kv * hd, 2 * h),
            m + "self_attn.o_proj.weight": (h, nh * hd), m + "mlp.gate_proj.weight": (ff, h),
            m + "mlp.up_proj.weight": (ff, h), m + "mlp.down_proj.weight": (h, ff),
            m + "input_layernorm.weight": (h,), m + "hidden_norm.weight": (h,),
            m + "post_attention_layernorm.weight": (h,), "norm.weight": (h,),
            "lm_head.weight": (c["draft_vocab_size"], h)}


def mtp_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    h, nh, kv, hd, ff = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                         c["intermediate_size"])
    b = "mtp.layers.0."
    return {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
            "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,),
            b + "self_attn.q_proj.weight": (nh * hd, h), b + "self_attn.k_proj.weight": (kv * hd, h),
            b + "self_attn.v_proj.weight": (kv * hd, h), b + "self_attn.o_proj.weight": (h, nh * hd),
            b + "mlp.gate_proj.weight": (ff, h), b + "mlp.up_proj.weight": (ff, h), b + "mlp.down_proj.weight": (h, ff),
            b + "input_layernorm.weight": (h,), b + "post_attention_layernorm.weight": (h,)}


def random_weights(shapes: dict[str, tuple[int, ...]], seed: int, std: float = 0.1) -> dict[str, np.ndarray]:
    """Norm weights near one, matrices N(0, std)."""
    rng = np.random.default_rng(seed)
    return {n: (1 + 0.1 * rng.standard_normal(s) if len(s) == 1 else std * rng.standard_normal(s)).astype(np.float32)
            for n, s in shapes.items()}


def draft_vocab_map(vocab: int, draft_vocab: int, seed: int) -> dict[str, np.ndarray]:
    """d2t offsets and the t2d mask of a draft vocabulary: a random subset of the target's ids."""
    ids = np.sort(np.random.default_rng(seed).choice(vocab, draft_vocab, replace=False))
    t2d = np.zeros(vocab, dtype=bool)
    t2d[ids] = True
    return {"d2t": (ids - np.arange(draft_vocab)).astype(np.int64), "t2d": t2d}


def write_eagle3_head(target_dir: Path, out_dir: Path, seed: int = 0, draft_vocab_size: int | None = None,
                      weights: dict[str, np.ndarray] | None = None, config: dict | None = None) -> Path:
    target = _target_config(target_dir)
    c = config or eagle3_config(target, draft_vocab_size or target["vocab_size"])
    tensors = dict(weights) if weights is not None else random_weights(eagle3_shapes(c), seed)
    if c["draft_vocab_size"] != c["vocab_size"] and "d2t" not in tensors:
        tensors.update(draft_vocab_map(c["vocab_size"], c["draft_vocab_size"], seed))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(c, indent=1))
    safetensors.numpy.save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


def write_mtp_target(target_dir: Path, out_dir: Path, seed: int = 0,
                     weights: dict[str, np.ndarray] | None = None) -> Path:
    """A copy of the target whose checkpoint also holds an MTP layer."""
    target_dir = Path(target_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in target_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out_dir / f.name)
    tensors = safetensors.numpy.load_file(str(target_dir / "model.safetensors"))
    tensors.update(weights if weights is not None else random_weights(mtp_shapes(_target_config(target_dir)), seed))
    safetensors.numpy.save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir


def write_scaled_attention_target(target_dir: Path, out_dir: Path, scale: float) -> Path:
    """A copy of the target whose attention outputs are scaled by `scale`: its next token
    leans on the current one (a head learns to copy it in a few hundred steps), the context
    still moves it. The bench's and the trained-head tests' target."""
    target_dir = Path(target_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in target_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out_dir / f.name)
    tensors = safetensors.numpy.load_file(str(target_dir / "model.safetensors"))
    for name in tensors:
        if name.endswith("self_attn.o_proj.weight"):
            tensors[name] = (tensors[name] * scale).astype(tensors[name].dtype)
    safetensors.numpy.save_file(tensors, str(out_dir / "model.safetensors"))
    return out_dir
