"""Qwen2.5-VL's vision tower (models/vision/qwen_vit.py) against transformers'
Qwen2_5_VisionTransformerPretrainedModel (fp32) with its weights: grids that fill windows
exactly, leave partial windows on either edge, and span two frames; window attention in two
layers, full attention in the middle one."""
from __future__ import annotations

import pytest
import torch

from mlxr.model_config import VisionArgs
from mlxr.models.vision.qwen_vit import QwenVisionTransformer

_HF = {"depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
       "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16, "out_hidden_size": 64,
       "fullatt_block_indexes": [1]}


@pytest.fixture(scope="module")
def towers():
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    torch.manual_seed(0)
    hf = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**_HF)).eval()
    with torch.no_grad():  # norms off 1, so that a wrong norm placement shows
        for name, p in hf.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    v = VisionArgs(tower="qwen2_5_vl", projector="qwen2_5_vl", hidden_size=32, intermediate_size=64,
                   num_hidden_layers=3, num_attention_heads=2, image_size=0, patch_size=4, layer_norm_eps=1e-6,
                   hidden_act="silu", tokens_per_image=0, image_token_id=0, image_marker="", image_sequence="",
                   image_token="", scale_factor=2, temporal_patch_size=2, window_size=16, full_attention_layers=(1,))
    ours = QwenVisionTransformer(v, 64)
    ours.load_state_dict(hf.state_dict(), strict=True)
    return ours, hf


@pytest.mark.parametrize("grid", [(1, 4, 6), (1, 12, 8), (1, 10, 18), (2, 8, 8)])
def test_qwen25_vl_tower_matches_hf(towers, grid):
    ours, hf = towers
    t, h, w = grid
    patches = torch.randn(t * h * w, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(h * w))
    with torch.no_grad():
        ref = hf(patches, grid_thw=torch.tensor([grid])).pooler_output
        got = ours(patches, grid)
    assert got.shape == ref.shape == (t * h * w // 4, 64)
    assert ((got - ref).norm() / ref.norm()).item() <= 1e-5
