"""EmbeddingGemma: Gemma 3's text stack run bidirectionally (config.json
`use_bidirectional_attention`; llama.cpp's "gemma-embedding"), mean-pooled, then the
sentence-transformers Dense projections (loaded by loader/encoder_model.py as the pooled head).
An encoder: whole inputs over a padded batch, no KV cache (mlxr/engine/encoder/).

A sliding layer lets a token see those less than `sliding_window // 2 + 1` positions away on
either side, as transformers' bidirectional window does (its config halves the stored window).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.layers.mlp import GatedMLP
from mlxr.layers.norm import GemmaRMSNorm
from mlxr.model_config import ModelArgs
from mlxr.models import gemma3
from mlxr.models.arch import Architecture
from mlxr.models.bert import GGUF_POOLING
from mlxr.ops.rotary.rotary import rotary_embedding


class EmbeddingGemmaAttention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        h, d = args.hidden_size, args.head_dim
        self.heads, self.kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm, self.k_norm = GemmaRMSNorm(d, args.rms_norm_eps), GemmaRMSNorm(d, args.rms_norm_eps)
        self.sliding = args.is_sliding(layer)
        self.theta = (args.rope_local_base_freq or args.rope_theta) if self.sliding else args.rope_theta
        self.scale = (args.query_pre_attn_scalar or d) ** -0.5

    def forward(self, x: torch.Tensor, masks: dict[bool, torch.Tensor]) -> torch.Tensor:
        b, t, _ = x.shape
        flat = x.reshape(b * t, -1)
        q = self.q_norm(self.q_proj(flat).view(b * t, self.heads, -1))
        k = self.k_norm(self.k_proj(flat).view(b * t, self.kv_heads, -1))
        v = self.v_proj(flat).view(b, t, self.kv_heads, -1).transpose(1, 2)
        d = self.head_dim
        inv_freq = 1.0 / self.theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
        q, k = rotary_embedding(q, k, torch.arange(t, device=x.device).repeat(b), inv_freq)
        q, k = (z.view(b, t, -1, d).transpose(1, 2) for z in (q, k))
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=masks[self.sliding], scale=self.scale,
                                                         enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class EmbeddingGemmaLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn = EmbeddingGemmaAttention(args, layer)
        self.mlp = GatedMLP(h, args.intermediate_size, args.hidden_act)
        self.input_layernorm, self.post_attention_layernorm = GemmaRMSNorm(h, eps), GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = GemmaRMSNorm(h, eps), GemmaRMSNorm(h, eps)

    def forward(self, x: torch.Tensor, masks: dict[bool, torch.Tensor]) -> torch.Tensor:
        b, t, h = x.shape
        attn = self.self_attn(self.input_layernorm(x.reshape(b * t, h)).view(b, t, h), masks)
        x = x + self.post_attention_layernorm(attn.reshape(b * t, h)).view(b, t, h)
        mlp = self.mlp(self.pre_feedforward_layernorm(x.reshape(b * t, h)))
        return x + self.post_feedforward_layernorm(mlp).view(b, t, h)


class EmbeddingGemmaModel(nn.Module):
    """ids, token types (unused), lengths [B] -> last hidden states [B, T, H]."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(EmbeddingGemmaLayer(args, i) for i in range(args.num_hidden_layers))
        self.norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.classifier = None

    def forward(self, ids: torch.Tensor, types: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        x = x * torch.tensor(self.args.hidden_size ** 0.5, dtype=x.dtype)
        masks = window_masks(lengths, ids.shape[1], self.args.sliding_window)
        for layer in self.layers:
            x = layer(x, masks)
        b, t, h = x.shape
        return self.norm(x.reshape(b * t, h)).view(b, t, h)


def window_masks(lengths: torch.Tensor, width: int, window: int | None) -> dict[bool, torch.Tensor]:
    """{sliding: [B, 1, T, T] bool}: every real key for full layers; those within the
    bidirectional window for sliding ones."""
    pos = torch.arange(width, device=lengths.device)
    real = (pos[None] < lengths[:, None])[:, None, None, :]
    if window is None:
        return {False: real, True: real}
    near = ((pos[:, None] - pos[None, :]).abs() < window // 2 + 1)[None, None]
    return {False: real, True: real & near}


# --- the declaration ----------------------------------------------------------------------
def _hf_fields(cfg: dict) -> dict[str, Any]:
    fields = gemma3.ARCH.hf_fields(cfg)
    return {**fields, "tie_word_embeddings": False,
            "extra": {"hf_model_type": cfg.get("model_type"), "encoder": True, "num_labels": 0}}


def _gguf_fields(m: Any) -> dict[str, Any]:
    pooling = m.raw("pooling_type")
    return {**gemma3.ARCH.gguf_fields(m), "tie_word_embeddings": False,
            "extra": {"gguf_architecture": m.arch, "encoder": True, "num_labels": 0,
                      "pooling": GGUF_POOLING.get(pooling) if pooling is not None else None}}


def is_embedding_gemma(config: dict) -> bool:
    """A Gemma 3 text config run bidirectionally is EmbeddingGemma (its model_type is gemma3_text)."""
    return config.get("model_type") == "gemma3_text" and config.get("use_bidirectional_attention") is True


# GGUF tensor -> our parameter name (llama.cpp stores Gemma's norms as 1 + w: undone at load).
GGUF_TENSORS = {
    "token_embd": "embed_tokens", "output_norm": "norm",
    "blk.{i}.attn_q": "layers.{i}.self_attn.q_proj", "blk.{i}.attn_k": "layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "layers.{i}.self_attn.v_proj", "blk.{i}.attn_output": "layers.{i}.self_attn.o_proj",
    "blk.{i}.attn_q_norm": "layers.{i}.self_attn.q_norm", "blk.{i}.attn_k_norm": "layers.{i}.self_attn.k_norm",
    "blk.{i}.attn_norm": "layers.{i}.input_layernorm",
    "blk.{i}.post_attention_norm": "layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_norm": "layers.{i}.pre_feedforward_layernorm",
    "blk.{i}.post_ffw_norm": "layers.{i}.post_feedforward_layernorm",
    "blk.{i}.ffn_gate": "layers.{i}.mlp.gate_proj", "blk.{i}.ffn_up": "layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "layers.{i}.mlp.down_proj",
    "dense_2": "pooled_head.0", "dense_3": "pooled_head.1",
}
# our parameter names whose GGUF value is 1 + w
GGUF_NORMS_WEIGHT = ("norm.weight", "layernorm.weight")


def hf_name(name: str) -> str | None:
    name = name[len("model."):] if name.startswith("model.") else name
    return None if name.startswith("lm_head.") else name


MODEL = EmbeddingGemmaModel
ARCH = Architecture("gemma-embedding", (), ("gemma-embedding",), hf_config=gemma3.ARCH.hf_config,
                    hf_fields=_hf_fields, hf_sliding=gemma3.ARCH.hf_sliding, default_rope_theta=1_000_000.0,
                    local_rope_theta=10000.0, hf_max_positions=2048, gguf_fields=_gguf_fields,
                    gguf_norm_plus_one=True)
