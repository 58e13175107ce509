"""Qwen3-MoE: Qwen3's attention (per-head q/k norms) with a sparse mixture of experts on every
layer (layers/moe.py); the top-k weights are renormalised where norm_topk_prob says so (llama.cpp
always renormalises, so a GGUF file does)."""
from __future__ import annotations

import re
from typing import Any

from mlxr.errors import UnsupportedModelError
from mlxr.formats.hf_config import boolean, positive_int
from mlxr.layers.moe import SparseMoE
from mlxr.model_config import ModelArgs
from mlxr.models import moe_arch
from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaBackbone, LlamaForCausalLM
from mlxr.models.qwen3 import HEAD_NORM_TENSORS, Qwen3Block, head_norm_shapes


class Qwen3MoeBlock(Qwen3Block):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.mlp = SparseMoE(args.hidden_size, moe_arch.expert_intermediate(args), args.num_experts,
                             args.num_experts_per_tok, args.hidden_act, args.norm_topk_prob)


class Qwen3MoeBackbone(LlamaBackbone):
    block_class = Qwen3MoeBlock


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    backbone_class = Qwen3MoeBackbone


_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def _checkpoint_name(name: str) -> tuple[str, int | None]:
    if match := _EXPERT.fullmatch(name):
        return f"{match.group(1)}{match.group(3)}.weight", int(match.group(2))
    return name, None


def _hf_fields(cfg: dict) -> dict[str, Any]:
    if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
        raise UnsupportedModelError("qwen3_moe with dense layers (decoder_sparse_step, mlp_only_layers) is not supported")
    key = "num_experts" if "num_experts" in cfg else "num_local_experts"  # transformers v5 writes the latter
    return {"num_experts": positive_int(cfg, key),
            "num_experts_per_tok": positive_int(cfg, "num_experts_per_tok"),
            "moe_intermediate_size": positive_int(cfg, "moe_intermediate_size"),
            "norm_topk_prob": boolean(cfg, "norm_topk_prob", False)}


def _gguf_fields(m: Any) -> dict[str, Any]:
    return {**moe_arch.gguf_counts(m), "moe_intermediate_size": m.pos_int("expert_feed_forward_length"),
            "norm_topk_prob": True}


def _layer_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    return {**head_norm_shapes(args), **moe_arch.layer_shapes(args)}


MODEL = Qwen3MoeForCausalLM
ARCH = Architecture(
    "qwen3moe", ("qwen3_moe",), ("qwen3moe",),
    hf_fields=_hf_fields,
    gguf_fields=_gguf_fields,
    gguf_tensors={**HEAD_NORM_TENSORS, **moe_arch.GGUF_TENSORS},
    layer_shapes=_layer_shapes,
    absent_layer_params=moe_arch.DENSE_MLP,
    checkpoint_name=_checkpoint_name,
)
