"""gpt-oss's experts (models/gpt_oss_moe.py) against transformers' own GptOssMLP on the same
weights: float experts, and MXFP4 experts kept 4-bit as the loader installs them (QuantStacked
of type MXFP4, quantized by gguf-py; HF given gguf-py's dequantization of the same blocks)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mlxr.layers.quant_linear import PackedWeight, QuantStacked
from mlxr.models.gpt_oss_moe import GptOssMoE, from_hf_experts
from paged_probe import rel_err

E, K, H, I = 8, 3, 64, 32


def _hf_block():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K)
    ref = GptOssMLP(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.6)  # pre-activations past the clamp of 7
    return ref


def _mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, out, in] float -> (its gguf-py MXFP4 blocks, gguf-py's dequantization of them)."""
    raw = quantize(w.numpy().astype(np.float32), GGMLQuantizationType.MXFP4)
    return torch.from_numpy(raw), torch.from_numpy(dequantize(raw, GGMLQuantizationType.MXFP4))


def _load(ours: GptOssMoE, ref, mxfp4: bool) -> None:
    parts = from_hf_experts(ref.experts.gate_up_proj.detach(), ref.experts.down_proj.detach())
    with torch.no_grad():
        ours.router.weight.copy_(ref.router.weight)
        ours.router.bias.copy_(ref.router.bias)
        w = ours.experts
        w.gate_proj.bias.copy_(ref.experts.gate_up_proj_bias[:, ::2])
        w.up_proj.bias.copy_(ref.experts.gate_up_proj_bias[:, 1::2])
        w.down_proj.bias.copy_(ref.experts.down_proj_bias)
        for name in ("gate", "up", "down"):
            proj = getattr(w, f"{name}_proj")
            if not mxfp4:
                proj.weight.copy_(parts[name])
                continue
            blocks, parts[name] = _mxfp4(parts[name])
            setattr(w, f"{name}_proj", QuantStacked(PackedWeight(blocks, "MXFP4", tuple(proj.weight.shape)),
                                                     proj.bias.detach().clone()))
        if mxfp4:  # HF computes with the weights the blocks hold
            gate_up = torch.stack([parts["gate"], parts["up"]], dim=2).reshape(E, 2 * I, H)  # rows interleaved
            ref.experts.gate_up_proj.copy_(gate_up.transpose(1, 2))
            ref.experts.down_proj.copy_(parts["down"].transpose(1, 2))


@pytest.mark.parametrize("mxfp4", [False, True])
def test_matches_transformers_gpt_oss_mlp(mxfp4):
    ref = _hf_block()
    ours = GptOssMoE(H, I, E, K)
    _load(ours, ref, mxfp4)
    x = torch.randn(1, 40, H, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = ref(x)[0]
        got = ours(x)
        gate = ours.experts.gate_proj.matmul(0, x[0])
    assert rel_err(got, want) <= 1e-5
    assert float(gate.max()) > 7.0  # the clamp bites
    assert len(torch.unique(ours.route(x[0])[1])) == E


def test_the_clamp_and_the_router_bias_matter():
    ref = _hf_block()
    ours = GptOssMoE(H, I, E, K, limit=1e9)
    _load(ours, ref, False)
    x = torch.randn(1, 40, H, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = ref(x)[0]
        assert rel_err(ours(x), want) > 1e-2
        ours.limit = 7.0
        ours.router.bias.zero_()
        assert rel_err(ours(x), want) > 1e-2
