"""Qwen3.5-MoE (text): Qwen3.5's hybrid layers (models/qwen35.py) with a mixture of experts on
every layer: top-k of the router's softmax, renormalised, plus a shared expert whose output a
per-token sigmoid gate scales. The shared expert's width is carried as intermediate_size."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.formats.hf_config import positive_int
from mlxr.layers.linear import Linear
from mlxr.layers.mlp import GatedMLP
from mlxr.layers.moe import SparseMoE
from mlxr.model_config import ModelArgs
from mlxr.models import moe_arch
from mlxr.models import qwen35_gguf
from mlxr.models.arch import Architecture
from mlxr.models.qwen35 import (Qwen35Backbone, Qwen35Block, Qwen35ForCausalLM, block_params, hf_fields as dense_fields,
                                text_config)
from mlxr.models.qwen3moe import _checkpoint_name


class SharedExpertMoE(SparseMoE):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args.hidden_size, moe_arch.expert_intermediate(args), args.num_experts,
                         args.num_experts_per_tok, args.hidden_act, norm_topk_prob=True)
        self.shared_expert = GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act)
        self.shared_expert_gate = Linear(args.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared


class Qwen35MoeBlock(Qwen35Block):
    def make_mlp(self, args: ModelArgs) -> nn.Module:
        return SharedExpertMoE(args)


class Qwen35MoeBackbone(Qwen35Backbone):
    block_class = Qwen35MoeBlock


class Qwen35MoeForCausalLM(Qwen35ForCausalLM):
    backbone_class = Qwen35MoeBackbone


def _hf_config(config: dict) -> dict:
    cfg = text_config(config)
    if "shared_expert_intermediate_size" in cfg:
        cfg["intermediate_size"] = cfg["shared_expert_intermediate_size"]
    return cfg


def _hf_fields(cfg: dict) -> dict[str, Any]:
    return {**dense_fields(cfg), "num_experts": positive_int(cfg, "num_experts"),
            "num_experts_per_tok": positive_int(cfg, "num_experts_per_tok"),
            "moe_intermediate_size": positive_int(cfg, "moe_intermediate_size"), "norm_topk_prob": True}


MODEL = Qwen35MoeForCausalLM
ARCH = Architecture("qwen35moe", ("qwen3_5_moe_text", "qwen3_5_moe"), ("qwen35moe",), hf_config=_hf_config,
                    hf_fields=_hf_fields, default_rope_theta=10_000_000.0, checkpoint_name=_checkpoint_name,
                    gguf_fields=qwen35_gguf.moe_gguf_fields, gguf_tensors=qwen35_gguf.MOE_TENSORS,
                    layer_params=block_params(Qwen35MoeBlock), gguf_layout=qwen35_gguf.to_hf_layout, gguf_partial_rotary=True)
