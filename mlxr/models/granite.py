"""Granite (3.x dense): the Llama anatomy with four multipliers (ModelArgs: embedding_multiplier,
residual_multiplier, attention_multiplier, logits_scaling)."""
from __future__ import annotations

from typing import Any

import torch

from mlxr.formats.hf_config import positive_float
from mlxr.layers.attention import AttnMetadata
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import KVCache, LlamaBackbone, LlamaBlock, LlamaForCausalLM, input_norm


class GraniteBlock(LlamaBlock):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        if args.attention_multiplier is not None:
            self.self_attn.attn.scale = args.attention_multiplier
        self.residual_multiplier = args.residual_multiplier

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As LlamaBlock, with both branch outputs scaled before they join the residual."""
        normed, residual = input_norm(self.input_layernorm, x, residual)
        attn = self.self_attn(normed, positions, kv_cache, meta)
        normed, residual = self.post_attention_layernorm(attn * self.residual_multiplier, residual)
        return self.mlp(normed) * self.residual_multiplier, residual


class GraniteBackbone(LlamaBackbone):
    block_class = GraniteBlock

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.embedding_multiplier = args.embedding_multiplier

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().embed(input_ids) * self.embedding_multiplier


class GraniteForCausalLM(LlamaForCausalLM):
    backbone_class = GraniteBackbone

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) / self.args.logits_scaling


def _hf_fields(cfg: dict) -> dict[str, Any]:
    return {
        "embedding_multiplier": positive_float(cfg, "embedding_multiplier", 1.0),
        "residual_multiplier": positive_float(cfg, "residual_multiplier", 1.0),
        "attention_multiplier": positive_float(cfg, "attention_multiplier", 1.0),
        "logits_scaling": positive_float(cfg, "logits_scaling", 1.0),
    }


def _gguf_fields(m: Any) -> dict[str, Any]:
    return {
        "embedding_multiplier": m.pos_float("embedding_scale", 1.0),
        "residual_multiplier": m.pos_float("residual_scale", 1.0),
        "attention_multiplier": m.pos_float("attention.scale", 1.0),
        "logits_scaling": m.pos_float("logit_scale", 1.0),
    }


MODEL = GraniteForCausalLM
ARCH = Architecture("granite", ("granite",), ("granite",), hf_fields=_hf_fields, gguf_fields=_gguf_fields,
                    gguf_permuted_qk=True)
