"""What Mixtral and Qwen3-MoE share in their declarations: expert tensor shapes and GGUF names."""
from __future__ import annotations

from typing import Any

from mlxr.model_config import ModelArgs

DENSE_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
# llama.cpp's stacked expert tensors and router.
GGUF_TENSORS = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj",
                "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj"}


def expert_intermediate(args: ModelArgs) -> int:
    return args.moe_intermediate_size or args.intermediate_size


def layer_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    e, h, i = args.num_experts, args.hidden_size, expert_intermediate(args)
    return {"mlp.gate.weight": (e, h), "mlp.experts.gate_proj.weight": (e, i, h),
            "mlp.experts.up_proj.weight": (e, i, h), "mlp.experts.down_proj.weight": (e, h, i)}


def gguf_counts(m: Any) -> dict[str, Any]:
    return {"num_experts": m.pos_int("expert_count"), "num_experts_per_tok": m.pos_int("expert_used_count")}
