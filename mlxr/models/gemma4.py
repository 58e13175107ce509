"""Gemma 4 (text, model_type gemma4_text): Gemma 3's sliding and full layers and four norms a
block, with plain `x * w` RMSNorms, q/k norms and a scale-free norm on v (attention scale 1),
values equal to the keys on full layers (attention_k_eq_v), the last num_kv_shared_layers layers
reading the K/V of the last earlier layer of their type (no K/V of their own, a double-wide MLP
where use_double_wide_mlp), per-layer input embeddings (hidden_size_per_layer_input: a token
table and a projection of the embeddings feeding a gated branch in every layer), an optional
mixture of experts beside the MLP (enable_moe_block) and a learned scalar per layer.

Not yet: full layers with their own head_dim or K/V heads (global_head_dim,
num_global_key_value_heads: the released checkpoints'), their partial "proportional" rope, and
GGUF files; each is refused naming the setting."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from mlxr.errors import UnsupportedModelError
from mlxr.formats.hf_config import boolean, positive_int, sliding_from_config
from mlxr.layers.attention import AttnMetadata, PagedAttention
from mlxr.layers.linear import Linear
from mlxr.layers.mlp import ACTIVATIONS, GatedMLP
from mlxr.layers.moe import SparseMoE
from mlxr.layers.norm import RMSNorm
from mlxr.layers.rope import RotaryEmbedding
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import KVCache, LlamaForCausalLM
from mlxr.ops.activation.activation import gated_activation
from mlxr.ops.norm.rms_norm import rms_normalize
from mlxr.ops.rotary.rotary import rope_cos_sin, rotate_half


def kv_sources(args: ModelArgs) -> tuple[int, ...]:
    """Per layer, the layer whose K/V cache it reads: itself, or for the last num_kv_shared_layers
    the last earlier layer of the same type (transformers' kv_sharing_modes)."""
    n, shared = args.num_hidden_layers, args.extra.get("kv_shared_layers", 0)
    first = n - shared
    out = list(range(n))
    for i in range(first, n):
        same = [j for j in range(first) if args.is_sliding(j) == args.is_sliding(i)]
        if not same:
            raise UnsupportedModelError(f"gemma4 layer {i} shares the K/V of a layer type no earlier layer has")
        out[i] = same[-1]
    return tuple(out)


class Gemma4Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, shared: bool) -> None:
        super().__init__()
        h, kv, d, eps = args.num_attention_heads, args.num_key_value_heads, args.head_dim, args.rms_norm_eps
        self.n_heads, self.n_kv, self.head_dim, self.eps, self.shared = h, kv, d, eps, shared
        sliding = args.is_sliding(layer)
        self.q_proj = Linear(args.hidden_size, h * d, bias=False)
        self.q_norm = RMSNorm(d, eps)
        if not shared:
            self.k_proj = Linear(args.hidden_size, kv * d, bias=False)
            k_eq_v = args.extra.get("k_eq_v", False) and not sliding
            self.v_proj = None if k_eq_v else Linear(args.hidden_size, kv * d, bias=False)
            self.k_norm = RMSNorm(d, eps)
        self.o_proj = Linear(h * d, args.hidden_size, bias=False)
        theta = (args.rope_local_base_freq or args.rope_theta) if sliding else args.rope_theta
        self.rotary = RotaryEmbedding(d, theta)
        self.attn = PagedAttention(h, kv, d, 1.0, args.sliding_window if sliding else None)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.n_heads, self.head_dim))
        if self.shared:  # the source layer stored this step's K/V already
            cos, sin = rope_cos_sin(positions, self.rotary.inv_freq, q.dtype)
            out = self.attn.attend(q * cos + rotate_half(q) * sin, kv_cache, meta)
        else:
            k = self.k_proj(x).view(t, self.n_kv, self.head_dim)
            v = k if self.v_proj is None else self.v_proj(x).view(t, self.n_kv, self.head_dim)
            v = rms_normalize(v, self.eps).to(v.dtype)
            out = self.attn(q, self.k_norm(k), v, kv_cache, meta, positions, self.rotary.frequencies(positions))
        return self.o_proj(out.reshape(t, -1))


class Gemma4MoE(SparseMoE):
    """Experts beside the MLP: routed on the block's input (normalised, scaled per channel and by
    hidden ** -0.5), softmax, top-k renormalised, then each chosen expert's weight scaled."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args.hidden_size, args.moe_intermediate_size or args.intermediate_size, args.num_experts,
                         args.num_experts_per_tok, args.hidden_act, True)
        self.scale = nn.Parameter(torch.ones(args.hidden_size), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(args.num_experts), requires_grad=False)
        self.eps, self.root = args.rms_norm_eps, args.hidden_size ** -0.5

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = (rms_normalize(x, self.eps) * self.scale.float() * self.root).to(x.dtype)
        probs = torch.softmax(self.gate(h).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.per_expert_scale.float()[ids]
        return weights.to(x.dtype), ids


class Gemma4Block(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, shared: bool) -> None:
        super().__init__()
        dim, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn = Gemma4Attention(args, layer, shared)
        wide = 2 if shared and args.extra.get("double_wide", False) else 1
        self.mlp = GatedMLP(dim, args.intermediate_size * wide, args.hidden_act)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(dim, eps))
        self.moe = Gemma4MoE(args) if args.num_experts else None
        if self.moe is not None:
            self.post_feedforward_layernorm_1, self.post_feedforward_layernorm_2 = RMSNorm(dim, eps), RMSNorm(dim, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(dim, eps)
        ple = args.extra.get("ple_dim", 0)
        if ple:
            self.per_layer_input_gate = Linear(dim, ple, bias=False)
            self.per_layer_projection = Linear(ple, dim, bias=False)
            self.post_per_layer_input_norm = RMSNorm(dim, eps)
        self.act = ACTIVATIONS[args.hidden_act]
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata,
                per_layer: torch.Tensor | None) -> torch.Tensor:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), positions, kv_cache, meta))
        out = self.mlp(self.pre_feedforward_layernorm(h))
        if self.moe is not None:
            experts = self.moe.mix(self.pre_feedforward_layernorm_2(h), *self.moe.route(h))
            out = self.post_feedforward_layernorm_1(out) + self.post_feedforward_layernorm_2(experts)
        h = h + self.post_feedforward_layernorm(out)
        if per_layer is not None:
            gated = gated_activation(self.per_layer_input_gate(h), per_layer, self.act)
            h = h + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return h * self.layer_scalar


class Gemma4Backbone(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.sources = kv_sources(args)
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Gemma4Block(args, i, self.sources[i] != i) for i in range(args.num_hidden_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.ple_dim, self.n_layers, self.hidden = args.extra.get("ple_dim", 0), args.num_hidden_layers, args.hidden_size
        if self.ple_dim:
            self.embed_tokens_per_layer = nn.Embedding(args.extra["ple_vocab"], self.n_layers * self.ple_dim)
            self.per_layer_model_projection = Linear(args.hidden_size, self.n_layers * self.ple_dim, bias=False)
            self.per_layer_projection_norm = RMSNorm(self.ple_dim, args.rms_norm_eps)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids).to(self.norm.weight.dtype)
        return h * torch.tensor(self.hidden**0.5, dtype=h.dtype)

    def per_layer_inputs(self, input_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """[T, layers, ple_dim]: the token's own table row and a projection of its embedding."""
        t, shape = input_ids.shape[0], (input_ids.shape[0], self.n_layers, self.ple_dim)
        table = self.embed_tokens_per_layer(input_ids).to(h.dtype)
        table = (table * torch.tensor(self.ple_dim**0.5, dtype=h.dtype)).view(shape)
        projected = (self.per_layer_model_projection(h) * self.hidden**-0.5).view(t, self.n_layers, self.ple_dim)
        return (self.per_layer_projection_norm(projected) + table) * 2**-0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttnMetadata, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        per_layer = self.per_layer_inputs(input_ids, h) if self.ple_dim else None
        for i, layer in enumerate(self.layers):
            h = layer(h, positions, kv_caches[self.sources[i]], meta, None if per_layer is None else per_layer[:, i])
        return self.norm(h)


class Gemma4ForCausalLM(LlamaForCausalLM):
    backbone_class = Gemma4Backbone


_EXPERTS = re.compile(r"(model\.layers\.\d+\.)(experts\.gate_up_proj|experts\.down_proj|router\.proj\.weight|"
                      r"router\.scale|router\.per_expert_scale)")


def _checkpoint_tensors(items: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """transformers' experts [E, 2I, H] (gate rows, then up rows) and router -> our MoE's names."""
    for name, tensor in items:
        match = _EXPERTS.fullmatch(name)
        if match is None:
            yield name, tensor
            continue
        prefix, part = match.groups()
        if part == "experts.gate_up_proj":
            gate, up = tensor.chunk(2, dim=1)
            yield f"{prefix}moe.experts.gate_proj.weight", gate.contiguous()
            yield f"{prefix}moe.experts.up_proj.weight", up.contiguous()
        elif part == "experts.down_proj":
            yield f"{prefix}moe.experts.down_proj.weight", tensor
        else:
            yield prefix + {"router.proj.weight": "moe.gate.weight", "router.scale": "moe.scale",
                            "router.per_expert_scale": "moe.per_expert_scale"}[part], tensor


def _hf_fields(cfg: dict) -> dict[str, Any]:
    _refuse_per_layer_shapes(cfg)
    if cfg.get("use_bidirectional_attention") == "all":
        raise UnsupportedModelError("gemma4 use_bidirectional_attention 'all' is not supported")
    moe = boolean(cfg, "enable_moe_block", False)
    layers = positive_int(cfg, "num_hidden_layers")
    shared = cfg.get("num_kv_shared_layers") or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < layers:
        raise UnsupportedModelError(f"gemma4 num_kv_shared_layers must be in 0..{layers - 1}, got {shared!r}")
    ple = cfg.get("hidden_size_per_layer_input") or 0
    fields: dict[str, Any] = {
        "tie_word_embeddings": boolean(cfg, "tie_word_embeddings", True),
        "extra": {"hf_model_type": "gemma4_text", "kv_shared_layers": shared,
                  "k_eq_v": boolean(cfg, "attention_k_eq_v", False),
                  "double_wide": boolean(cfg, "use_double_wide_mlp", False),
                  "ple_dim": positive_int(cfg, "hidden_size_per_layer_input") if ple else 0,
                  "ple_vocab": positive_int(cfg, "vocab_size_per_layer_input", 262144) if ple else 0},
    }
    if moe:
        fields.update(num_experts=positive_int(cfg, "num_experts"), num_experts_per_tok=positive_int(cfg, "top_k_experts"),
                      moe_intermediate_size=positive_int(cfg, "moe_intermediate_size"))
    return fields


def _refuse_per_layer_shapes(cfg: dict) -> None:
    """Full layers with another head_dim or K/V head count would need a K/V cache of their own shape."""
    per_layer = cfg.get("per_layer_config")
    overrides = list(per_layer.values()) if isinstance(per_layer, dict) else [{"head_dim": cfg.get("global_head_dim", 512)}]
    for o in overrides:
        if not isinstance(o, dict):
            continue
        if o.get("head_dim", cfg.get("head_dim")) != cfg.get("head_dim") or \
                o.get("num_key_value_heads", cfg.get("num_key_value_heads")) != cfg.get("num_key_value_heads"):
            raise UnsupportedModelError("gemma4 full layers with their own head_dim or K/V heads (global_head_dim, "
                                        "num_global_key_value_heads) are not supported yet")
    for params in (cfg.get("rope_parameters") or {}).values():
        if isinstance(params, dict) and params.get("partial_rotary_factor", 1.0) != 1.0:
            raise UnsupportedModelError("gemma4 partial_rotary_factor other than 1 is not supported yet")


def _hf_sliding(cfg: dict, layers: int) -> tuple[int | None, tuple[bool, ...]]:
    window, sliding = sliding_from_config({"sliding_window": 512, **cfg}, layers,
                                          pattern=lambda _, n: tuple((i + 1) % 6 != 0 for i in range(n)))
    return window, sliding[:-1] + (False,)  # transformers forces the last layer to full attention


def _gguf_fields(_: Any) -> dict[str, Any]:
    raise UnsupportedModelError("Gemma 4 GGUF files are not supported yet (HF directories are)")


MODEL = Gemma4ForCausalLM
ARCH = Architecture(
    "gemma4", ("gemma4_text",), ("gemma4",),
    hf_fields=_hf_fields,
    hf_sliding=_hf_sliding,
    default_rope_theta=1_000_000.0,
    local_rope_theta=10000.0,
    hf_max_positions=131072,
    gguf_fields=_gguf_fields,
    checkpoint_tensors=_checkpoint_tensors,
)
