"""NomicBERT encoders (nomic-embed-text v1/v1.5): BERT's post-norm blocks with rotary positions
(no position table), bias-free projections and a SwiGLU MLP. Bidirectional over a padded batch,
no KV cache (mlxr/engine/encoder/).

Parameter names are transformers 5.x's (`layers.{i}.self_attn.q_proj`, `mlp.gate_proj`, ...).
nomic-ai's own checkpoints (the remote-code layout: `encoder.layers.{i}.attn.Wqkv`, `mlp.fc11`,
`norm1`, `emb_ln`, and config keys `n_embd`, `n_head`, ...) are renamed at load, as
transformers' own conversion does: fc11 is the up projection, fc12 the gate.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from mlxr.errors import UnsupportedModelError
from mlxr.formats.hf_config import positive_float, positive_int
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.bert import GGUF_POOLING, encoder_hf_config, num_labels, padding_mask
from mlxr.ops.rotary.rotary import rotary_embedding


class NomicEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.extra.get("type_vocab_size", 2), args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.rms_norm_eps)

    def forward(self, ids: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.word_embeddings(ids) + self.token_type_embeddings(types))


class NomicAttention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h, width = args.hidden_size, args.num_attention_heads * args.head_dim
        self.heads, self.head_dim = args.num_attention_heads, args.head_dim
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(h, width, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(width, h, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        positions = torch.arange(t, device=x.device)
        q, k = rotary_embedding(q.reshape(b * t, self.heads, -1), k.reshape(b * t, self.heads, -1),
                                positions.repeat(b), inv_freq)
        q, k = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k))
        out = nn.functional.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class NomicMLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h, i = args.hidden_size, args.intermediate_size
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class NomicLayer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.self_attn, self.mlp = NomicAttention(args), NomicMLP(args)
        self.post_attention_layernorm = nn.LayerNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_mlp_layernorm = nn.LayerNorm(args.hidden_size, eps=args.rms_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        x = self.post_attention_layernorm(x + self.self_attn(x, mask, inv_freq))
        return self.post_mlp_layernorm(x + self.mlp(x))


class NomicBertModel(nn.Module):
    """ids, token types, lengths [B] -> last hidden states [B, T, H] (padding rows are junk)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embeddings = NomicEmbeddings(args)
        self.layers = nn.ModuleList(NomicLayer(args) for _ in range(args.num_hidden_layers))
        self.classifier = None

    def forward(self, ids: torch.Tensor, types: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x, mask = self.embeddings(ids, types), padding_mask(lengths, ids.shape[1])
        # computed per call: the model is built on the meta device and its weights assigned
        d = self.args.head_dim
        inv_freq = 1.0 / self.args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
        for layer in self.layers:
            x = layer(x, mask, inv_freq)
        return x


# --- the declaration ----------------------------------------------------------------------
# nomic-ai's config keys -> transformers 5.x's.
_ORIGINAL_KEYS = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                  "n_inner": "intermediate_size", "layer_norm_epsilon": "layer_norm_eps",
                  "n_positions": "max_position_embeddings"}


def nomic_hf_config(config: dict) -> dict:
    renamed = {_ORIGINAL_KEYS.get(k, k): v for k, v in config.items()}
    if "intermediate_size" not in renamed and "hidden_size" in renamed:
        renamed["intermediate_size"] = 4 * renamed["hidden_size"]  # nomic's n_inner default
    cfg = encoder_hf_config(renamed)
    cfg["_raw"] = {**renamed, "_original": config}
    return cfg


def nomic_hf_fields(cfg: dict) -> dict[str, Any]:
    raw = cfg["_raw"]
    _refuse_variants(raw)
    if num_labels(raw):
        raise UnsupportedModelError("NomicBERT sequence-classification heads are not supported (embeddings only)")
    return {"hidden_act": "silu", "rms_norm_eps": positive_float(cfg, "layer_norm_eps", 1e-12),
            "rope_theta": _theta(raw), "tie_word_embeddings": False,
            "max_position_embeddings": positive_int(cfg, "max_position_embeddings", 2048),
            "extra": {"hf_model_type": "nomic_bert", "encoder": True, "position_offset": 0,
                      "type_vocab_size": positive_int(cfg, "type_vocab_size", 2), "num_labels": 0,
                      "pad_token_id": raw.get("pad_token_id")}}


def _theta(raw: dict) -> float:
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_theta"):
        return float(params["rope_theta"])
    return float(raw.get("rotary_emb_base") or raw.get("rope_theta") or 1000.0)


def _refuse_variants(raw: dict) -> None:
    """The original layout's switches this model does not implement, by name."""
    checks = {"activation_function": ("swiglu", None), "prenorm": (False, None), "causal": (False, None),
              "rotary_emb_fraction": (1.0, None), "rotary_emb_interleaved": (False, None),
              "qkv_proj_bias": (False, None), "mlp_fc1_bias": (False, None), "mlp_fc2_bias": (False, None),
              "moe_every_n_layers": (0, None)}
    for key, allowed in checks.items():
        if raw.get(key) not in allowed:
            raise UnsupportedModelError(f"NomicBERT with {key}={raw[key]!r} is not supported")
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"NomicBERT with rope_type {params['rope_type']!r} is not supported")


def nomic_gguf_fields(m: Any) -> dict[str, Any]:
    pooling = m.raw("pooling_type")
    types = m.metadata.get("tokenizer.ggml.token_type_count", 2)
    return {"hidden_act": "silu", "rms_norm_eps": m.pos_float("attention.layer_norm_epsilon", 1e-12),
            "tie_word_embeddings": False,
            "extra": {"gguf_architecture": m.arch, "encoder": True, "position_offset": 0,
                      "type_vocab_size": max(int(types), 1), "num_labels": 0,
                      "pooling": GGUF_POOLING.get(pooling) if pooling is not None else None}}


# GGUF tensor -> our parameter name ("{i}": the layer); attn_qkv is split at load.
GGUF_TENSORS = {
    "token_embd": "embeddings.word_embeddings", "token_types": "embeddings.token_type_embeddings",
    "token_embd_norm": "embeddings.LayerNorm",
    "blk.{i}.attn_qkv": "layers.{i}.self_attn.qkv_proj",
    "blk.{i}.attn_output": "layers.{i}.self_attn.o_proj",
    "blk.{i}.attn_output_norm": "layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_up": "layers.{i}.mlp.up_proj", "blk.{i}.ffn_gate": "layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_down": "layers.{i}.mlp.down_proj",
    "blk.{i}.layer_output_norm": "layers.{i}.post_mlp_layernorm",
}
HF_PREFIXES = ("nomic_bert.", "model.")
# nomic-ai's layout -> ours (applied in order, each a regex on the whole name).
_ORIGINAL_NAMES = ((r"^encoder\.layers\.", "layers."), (r"^emb_ln\.", "embeddings.LayerNorm."),
                   (r"\.attn\.out_proj\.", ".self_attn.o_proj."), (r"\.attn\.Wqkv\.", ".self_attn.qkv_proj."),
                   (r"\.mlp\.fc11\.", ".mlp.up_proj."), (r"\.mlp\.fc12\.", ".mlp.gate_proj."),
                   (r"\.mlp\.fc2\.", ".mlp.down_proj."), (r"\.norm1\.", ".post_attention_layernorm."),
                   (r"\.norm2\.", ".post_mlp_layernorm."))
_UNUSED = ("cls.", "lm_head.", "pooler.", "embeddings.position_ids")


def hf_name(name: str) -> str | None:
    """A checkpoint name (either layout) -> ours; None for a tensor an embedder does not use."""
    for prefix in HF_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(_UNUSED):
        return None
    for pattern, new in _ORIGINAL_NAMES:
        name = re.sub(pattern, new, name)
    return name


def split_fused(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """A fused q/k/v projection (nomic's Wqkv, GGUF attn_qkv) -> its three thirds."""
    if ".self_attn.qkv_proj." not in name:
        return [(name, tensor)]
    parts = tensor.chunk(3, dim=0)
    return [(name.replace("qkv_proj", p), t) for p, t in zip(("q_proj", "k_proj", "v_proj"), parts)]


MODEL = NomicBertModel
ARCH = Architecture("nomic-bert", ("nomic_bert",), ("nomic-bert",), hf_config=nomic_hf_config,
                    hf_fields=nomic_hf_fields, hf_max_positions=2048, default_rope_theta=1000.0,
                    gguf_fields=nomic_gguf_fields)
