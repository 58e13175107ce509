"""Llama family (Llama 2/3, TinyLlama, SmolLM). Math only; weights are loaded from outside."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.formats.hf_config import no_sliding
from mlxr.layers.attention import AttnMetadata, PagedAttention
from mlxr.layers.fused_linear import merge_linears
from mlxr.layers.linear import Linear, VocabProjection
from mlxr.layers.lora import plain
from mlxr.layers.mlp import GatedMLP
from mlxr.layers.norm import RMSNorm
from mlxr.layers.rope import RotaryEmbedding
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.ops.rotary.rotary import qkv_rope_write_kv

KVCache = tuple[torch.Tensor, torch.Tensor]


class LlamaAttention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
        )
        bias = args.attention_bias
        self.q_proj = Linear(args.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(args.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = Linear(args.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, args.hidden_size, bias=False)
        self.rotary = RotaryEmbedding(self.head_dim, args.rope_theta, args.rope_scaling)
        window = args.sliding_window if args.is_sliding(layer) else None
        # longrope scales cos and sin: q.k by the square of that factor
        scale = self.head_dim**-0.5 * self.rotary.attention_factor**2
        self.attn = PagedAttention(self.n_heads, self.n_kv, self.head_dim, scale, window)
        self.q_norm: nn.Module = nn.Identity()  # per-head norms: Gemma 3 sets them
        self.k_norm: nn.Module = nn.Identity()
        self.qkv_proj: nn.Module | None = None  # q, k and v in one matrix (fuse_projections)

    def fuse_projections(self) -> bool:
        merged = merge_linears([self.q_proj, self.k_proj, self.v_proj])
        if merged is not None:
            self.qkv_proj, self.q_proj, self.k_proj, self.v_proj = merged, None, None, None
        return merged is not None

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v as [T, heads, head_dim]."""
        t, h, kv, d = x.shape[0], self.n_heads, self.n_kv, self.head_dim
        if self.qkv_proj is None:
            return self.q_proj(x).view(t, h, d), self.k_proj(x).view(t, kv, d), self.v_proj(x).view(t, kv, d)
        # One view and split_with_sizes: a third of the cost of split + three views (decode, per layer).
        return self.qkv_proj(x).view(t, h + 2 * kv, d).split_with_sizes([h, kv, kv], 1)

    def normed_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v before RoPE: per-head norms (Identity unless a model sets them) applied."""
        q, k, v = self.project_qkv(x)
        return self.q_norm(q), self.k_norm(k), v

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata
    ) -> torch.Tensor:
        t = x.shape[0]
        q = self._fused_decode_qkv(x, positions, kv_cache, meta)
        if q is not None:
            out = self.attn.attend(q, kv_cache, meta)
        else:
            q, k, v = self.normed_qkv(x)
            out = self.attn(q, k, v, kv_cache, meta, positions, self.rotary.frequencies(positions))
        return self.o_proj(out.reshape(t, -1))

    def _fused_decode_qkv(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                          meta: AttnMetadata) -> torch.Tensor | None:
        """One decode token's rotated q, its K/V already in the cache, from one kernel; None where
        it does not apply (see qkv_rope_write_kv; per-head norms sit between projection and rope)."""
        proj = plain(self.qkv_proj)  # a LoRA wrapper while no adapter runs: its base
        if type(proj) is not Linear or type(self.q_norm) is not nn.Identity or type(self.k_norm) is not nn.Identity:
            return None
        return qkv_rope_write_kv(x, proj.weight, proj.bias, self.n_heads, self.n_kv, positions,
                                 self.rotary.frequencies(positions), kv_cache[0], kv_cache[1], meta.slot_mapping)


class LlamaBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(args, layer)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this block's MLP output, the residual stream before it): the caller's next norm adds
        the two in its fused add-and-norm, so no separate residual add runs."""
        normed, residual = input_norm(self.input_layernorm, x, residual)
        attn = self.self_attn(normed, positions, kv_cache, meta)
        normed, residual = self.post_attention_layernorm(attn, residual)
        return self.mlp(normed), residual


def input_norm(norm: nn.Module, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first block gets the embeddings alone; later ones add the carried residual."""
    if residual is None:
        return norm(x), x
    return norm(x, residual)


class LlamaBackbone(nn.Module):
    block_class = LlamaBlock

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(
            self.block_class(args, i) for i in range(args.num_hidden_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # The table may be stored narrower than the activations (see layers/linear.py).
        return self.embed_tokens(input_ids).to(self.norm.weight.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttnMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """inputs_embeds, when given, stands for embed(input_ids) (image embeddings spliced in)."""
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            h, residual = layer(h, positions, kv_cache, meta, residual)
        return input_norm(self.norm, h, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Hidden states for a flat batch of tokens; logits only for the rows asked for."""

    backbone_class = LlamaBackbone

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = self.backbone_class(args)
        self.lm_head = VocabProjection(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttnMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.args.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


MODEL = LlamaForCausalLM
ARCH = Architecture("llama", ("llama", "tinyllama"), ("llama",), gguf_permuted_qk=True,
                    hf_sliding=no_sliding, hf_max_positions=2048)
