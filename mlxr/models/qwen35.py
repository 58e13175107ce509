"""Qwen3.5 (dense, text): three Gated DeltaNet layers (layers/gated_deltanet.py, a recurrent state
per sequence) to one full-attention layer. Its attention is gated (q_proj doubles as a
per-head sigmoid gate on the output), rotates the first partial_rotary_factor of each head's
dims, and norms q and k per head; every RMSNorm but DeltaNet's gated one scales by 1 + w.

Text positions only: the checkpoint's multimodal RoPE sections all see the same position
for text, which is plain RoPE."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.errors import ModelFormatError
from mlxr.formats.hf_config import positive_int
from mlxr.layers.attention import AttnMetadata, PagedAttention
from mlxr.layers.gated_deltanet import GatedDeltaNet
from mlxr.layers.linear import Linear
from mlxr.layers.mlp import GatedMLP
from mlxr.layers.norm import GemmaRMSNorm
from mlxr.layers.rope import RotaryEmbedding
from mlxr.model_config import LinearAttentionArgs, ModelArgs
from mlxr.models import qwen35_gguf
from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaBackbone, LlamaForCausalLM, input_norm
from mlxr.ops.rotary.rotary import rotary_embedding

FULL, LINEAR = "full_attention", "linear_attention"


class Qwen35Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        h, kv, d, bias = self.n_heads, self.n_kv, self.head_dim, args.attention_bias
        self.q_proj = Linear(args.hidden_size, 2 * h * d, bias=bias)  # per head: its query, then its gate
        self.k_proj = Linear(args.hidden_size, kv * d, bias=bias)
        self.v_proj = Linear(args.hidden_size, kv * d, bias=bias)
        self.o_proj = Linear(h * d, args.hidden_size, bias=bias)
        self.q_norm = GemmaRMSNorm(d, args.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(d, args.rms_norm_eps)
        self.rotary_dim = int(d * args.partial_rotary_factor)
        self.rotary = RotaryEmbedding(self.rotary_dim, args.rope_theta, args.rope_scaling)
        self.attn = PagedAttention(h, kv, d, d**-0.5)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttnMetadata) -> torch.Tensor:
        t, d, r = x.shape[0], self.head_dim, self.rotary_dim
        q, gate = self.q_proj(x).view(t, self.n_heads, 2 * d).split([d, d], dim=-1)
        q = self.q_norm(q.contiguous())
        k = self.k_norm(self.k_proj(x).view(t, self.n_kv, d))
        v = self.v_proj(x).view(t, self.n_kv, d)
        q_rot, k_rot = rotary_embedding(q[..., :r].contiguous(), k[..., :r].contiguous(), positions,
                                        self.rotary.frequencies(positions))
        q, k = torch.cat([q_rot, q[..., r:]], dim=-1), torch.cat([k_rot, k[..., r:]], dim=-1)
        out = self.attn(q, k, v.contiguous(), kv_cache, meta).reshape(t, -1)
        return self.o_proj(out * torch.sigmoid(gate.reshape(t, -1)))


def linear_attention(args: ModelArgs, layer: int) -> GatedDeltaNet:
    la = args.linear_attention
    return GatedDeltaNet(args.hidden_size, la.num_key_heads, la.num_value_heads, la.key_head_dim,
                         la.value_head_dim, la.conv_kernel, args.rms_norm_eps)


class Qwen35Block(nn.Module):
    """A token mixer (DeltaNet or gated attention, named as the checkpoint names them) and an MLP."""

    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        # A layer past the table (the multi-token-prediction layer, built by a proposer) is full attention.
        kinds = args.linear_attention.layers
        self.is_linear = layer < len(kinds) and kinds[layer]
        if self.is_linear:
            self.linear_attn = linear_attention(args, layer)
        else:
            self.self_attn = Qwen35Attention(args, layer)
        self.mlp = self.make_mlp(args)
        self.input_layernorm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)

    def make_mlp(self, args: ModelArgs) -> nn.Module:
        return GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache, meta: AttnMetadata,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As LlamaBlock: (MLP output, residual before it) for the next fused add-and-norm."""
        normed, residual = input_norm(self.input_layernorm, x, residual)
        mixer = self.linear_attn if self.is_linear else self.self_attn
        normed, residual = self.post_attention_layernorm(mixer(normed, positions, kv_cache, meta), residual)
        return self.mlp(normed), residual


class Qwen35Backbone(LlamaBackbone):
    block_class = Qwen35Block

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)


class Qwen35ForCausalLM(LlamaForCausalLM):
    backbone_class = Qwen35Backbone


def text_config(config: dict) -> dict:
    """The text model's keys: a multimodal config (model_type qwen3_5) nests them in text_config."""
    text = config.get("text_config")
    if text is None:
        return dict(config)
    if not isinstance(text, dict):
        raise ModelFormatError("config.json text_config must be an object")
    merged = dict(text)
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id"):
        if key not in merged and key in config:
            merged[key] = config[key]
    return merged


def layer_kinds(cfg: dict, layers: int) -> tuple[bool, ...]:
    kinds = cfg.get("layer_types")
    if kinds is None:
        interval = positive_int(cfg, "full_attention_interval", 4)
        return tuple((i + 1) % interval != 0 for i in range(layers))
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in (FULL, LINEAR) for k in kinds):
        raise ModelFormatError(f"config.json layer_types must list {layers} of {FULL!r} / {LINEAR!r}")
    return tuple(k == LINEAR for k in kinds)


def hf_fields(cfg: dict) -> dict[str, Any]:
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ModelFormatError(f"config.json partial_rotary_factor must be in (0, 1], got {factor!r}")
    layers = positive_int(cfg, "num_hidden_layers")
    linear = LinearAttentionArgs(
        layers=layer_kinds(cfg, layers),
        num_key_heads=positive_int(cfg, "linear_num_key_heads", 16),
        num_value_heads=positive_int(cfg, "linear_num_value_heads", 32),
        key_head_dim=positive_int(cfg, "linear_key_head_dim", 128),
        value_head_dim=positive_int(cfg, "linear_value_head_dim", 128),
        conv_kernel=positive_int(cfg, "linear_conv_kernel_dim", 4),
    )
    if linear.num_value_heads % linear.num_key_heads:
        raise ModelFormatError("config.json linear_num_value_heads must be a multiple of linear_num_key_heads")
    return {"linear_attention": linear, "partial_rotary_factor": float(factor)}


def block_params(block_class: type[nn.Module]):
    """(args, layer) -> that layer's parameters and their shapes in a GGUF file, from the block
    built on the meta device."""
    def params(args: ModelArgs, layer: int) -> dict[str, tuple[int, ...]]:
        with torch.device("meta"):
            block = block_class(args, layer)
        return {name: qwen35_gguf.stored_shape(name, tuple(p.shape)) for name, p in block.named_parameters()}
    return params


MODEL = Qwen35ForCausalLM
ARCH = Architecture("qwen35", ("qwen3_5_text", "qwen3_5"), ("qwen35",), hf_config=text_config, hf_fields=hf_fields,
                    default_rope_theta=10_000_000.0, gguf_fields=qwen35_gguf.gguf_fields,
                    gguf_tensors=qwen35_gguf.TENSORS, layer_params=block_params(Qwen35Block),
                    gguf_layout=qwen35_gguf.to_hf_layout, gguf_partial_rotary=True)
