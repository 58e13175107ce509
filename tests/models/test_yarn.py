"""YaRN frequencies (layers/yarn.py) against transformers' own rope init for gpt-oss's config
(correction range not truncated) and a truncated one."""
from __future__ import annotations

import pytest
import torch

from mlxr.layers.yarn import yarn_attention_factor, yarn_inv_freq

pytest.importorskip("transformers")


@pytest.mark.parametrize("truncate, theta, factor, original", [(False, 150000.0, 32.0, 4096), (True, 1e6, 4.0, 32768)])
def test_matches_transformers_yarn(truncate, theta, factor, original):
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "rope_theta": theta, "factor": factor, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": original, "truncate": truncate}
    cfg = GptOssConfig(head_dim=64, hidden_size=256, num_attention_heads=4, rope_parameters=rope,
                       max_position_embeddings=int(original * factor))
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    got = yarn_inv_freq(64, theta, factor, original, 32.0, 1.0, truncate)
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    assert yarn_attention_factor(factor) == pytest.approx(want_factor, rel=1e-12)
    assert not torch.allclose(got, 1.0 / theta ** (torch.arange(0, 64, 2) / 64))  # the scaling does something
