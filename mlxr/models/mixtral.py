"""Mixtral: the Llama anatomy with a sparse mixture of experts for the MLP (layers/moe.py): softmax
router, top-k, weights renormalised. llama.cpp writes it as GGUF architecture "llama" with experts."""
from __future__ import annotations

import re
from typing import Any

from mlxr.formats.hf_config import positive_int
from mlxr.layers.moe import SparseMoE
from mlxr.model_config import ModelArgs
from mlxr.models import moe_arch
from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaBackbone, LlamaBlock, LlamaForCausalLM


class MixtralBlock(LlamaBlock):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.mlp = SparseMoE(args.hidden_size, args.intermediate_size, args.num_experts,
                             args.num_experts_per_tok, args.hidden_act, norm_topk_prob=True)


class MixtralBackbone(LlamaBackbone):
    block_class = MixtralBlock


class MixtralForCausalLM(LlamaForCausalLM):
    backbone_class = MixtralBackbone


_EXPERT = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight")
_ROUTER = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.gate\.weight")
_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def _checkpoint_name(name: str) -> tuple[str, int | None]:
    """HF's block_sparse_moe.experts.N.w1/w3/w2 -> stacked mlp.experts.gate/up/down_proj."""
    if match := _EXPERT.fullmatch(name):
        return f"{match.group(1)}mlp.experts.{_PROJ[match.group(3)]}.weight", int(match.group(2))
    if match := _ROUTER.fullmatch(name):
        return f"{match.group(1)}mlp.gate.weight", None
    return name, None


def _hf_fields(cfg: dict) -> dict[str, Any]:
    return {"num_experts": positive_int(cfg, "num_local_experts"),
            "num_experts_per_tok": positive_int(cfg, "num_experts_per_tok")}


def _has_experts(metadata: dict) -> bool:
    arch = metadata.get("general.architecture")
    count = metadata.get(f"{arch}.expert_count")
    return isinstance(count, int) and count > 0


MODEL = MixtralForCausalLM
ARCH = Architecture(
    "mixtral", ("mixtral",), ("llama",),
    hf_fields=_hf_fields,
    gguf_fields=moe_arch.gguf_counts,
    gguf_tensors=moe_arch.GGUF_TENSORS,
    layer_shapes=moe_arch.layer_shapes,
    absent_layer_params=moe_arch.DENSE_MLP,
    checkpoint_name=_checkpoint_name,
    gguf_match=_has_experts,
    gguf_permuted_qk=True,
)
