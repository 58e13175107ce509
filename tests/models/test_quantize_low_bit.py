"""`mlxr quantize` to q4_1, q6_k, q5_k_m, q3_k_m and q2_k: llama.cpp's type mix, every tensor
checked by gguf-py dequantizing what we wrote, and the file served with the types kept
quantized, its logits matching the same file dequantized at load by gguf-py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quantize import _synthetic_hf, gaussian, rel_rms

from mlxr.formats.gguf import open_gguf
from mlxr.layers.quant_linear import QuantLinear
from mlxr.llm import LLM
from mlxr.quantize import quantize_model
from mlxr.quantize.low_bit import quantize_iq4_nl, quantize_q2_k, quantize_q3_k, quantize_q5_k

# Relative RMS error of a Gaussian tensor after a round trip, per type (llama.cpp's own
# quantizers land near 0.04, 0.13, 0.23, 0.07 for these four on Gaussian data).
LIMITS = {"Q5_K": 0.045, "Q3_K": 0.16, "Q2_K": 0.30, "IQ4_NL": 0.085, "Q4_1": 0.09, "Q5_1": 0.045,
          "Q4_K": 0.10, "Q6_K": 0.03, "Q8_0": 0.01, "Q5_0": 0.05, "F32": 0.0}


@pytest.mark.parametrize("fn, qtype, block_bytes, block_elems", [
    (quantize_q5_k, Q.Q5_K, 176, 256), (quantize_q3_k, Q.Q3_K, 110, 256),
    (quantize_q2_k, Q.Q2_K, 84, 256), (quantize_iq4_nl, Q.IQ4_NL, 18, 32),
])
def test_blocks_round_trip_through_gguf_py(fn, qtype: Q, block_bytes: int, block_elems: int) -> None:
    x = gaussian((64, 768)) * np.float32(0.02)
    blocks = fn(x)
    assert blocks.dtype == np.uint8 and blocks.shape == (64, 768 // block_elems * block_bytes)
    assert rel_rms(dequantize(blocks, qtype), x) < LIMITS[qtype.name]
    zeros = fn(np.zeros((2, 256), np.float32))  # an all-zero block stays zero, no NaN
    assert np.array_equal(dequantize(zeros, qtype), np.zeros((2, 256), np.float32))


def _expected(file_type: str, name: str, n_layers: int = 8) -> str:
    """llama.cpp's llama_tensor_get_type for a dense llama with 4 query heads per KV head."""
    if name.endswith("norm.weight"):
        return "F32"
    if name == "output.weight":
        return "Q6_K"
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    kind = name.split(".")[2] if layer >= 0 else ""
    more = layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2
    if file_type == "q5_k_m":
        return "Q6_K" if kind in ("attn_v", "ffn_down") and more else "Q5_K"
    if file_type == "q3_k_m":
        return {"attn_v": "Q5_K" if layer < 2 else "Q4_K", "ffn_down": "Q5_K" if layer < n_layers // 16 else "Q4_K",
                "attn_output": "Q4_K"}.get(kind, "Q3_K")
    if file_type == "q2_k":
        return {"attn_v": "Q4_K", "ffn_down": "Q3_K", "attn_output": "Q3_K"}.get(kind, "Q2_K")
    return {"q4_1": "Q4_1", "q6_k": "Q6_K"}[file_type]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory):
    return _synthetic_hf(tmp_path_factory.mktemp("src") / "hf")


@pytest.mark.parametrize("file_type", ["q4_1", "q6_k", "q5_k_m", "q3_k_m", "q2_k"])
def test_file_types_mix_round_trip_and_serve_kept_quantized(tmp_path, synthetic, file_type: str) -> None:
    from mlxr.quantize.hf_convert import HFToGGUF
    import json

    hf_dir, weights = synthetic
    out = quantize_model(hf_dir, tmp_path / f"m-{file_type}.gguf", file_type).path
    conv = HFToGGUF(json.loads((hf_dir / "config.json").read_text()))
    with open_gguf(out) as f:
        types = {n: f.tensor_info(n).ggml_type for n in f.tensor_names}
        for hf_name, value in weights.items():
            name = conv.gguf_name(hf_name)
            assert types[name] == _expected(file_type, name), name
            assert rel_rms(f.load(name), conv.convert(hf_name, value)) <= LIMITS[types[name]], name
    kept = LLM(str(out), quantization="gguf", dtype=torch.float32, max_num_seqs=1)
    qtypes = {m.qtype for m in kept.loaded.model.modules() if isinstance(m, QuantLinear)}
    assert qtypes == {t for n, t in types.items() if t != "F32" and n != "token_embd.weight"} - {"F32"}
    ref = LLM(str(out), quantization="none", dtype=torch.float32, max_num_seqs=1)
    from paged_probe import paged_logits

    ids = kept.tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again")
    ours, theirs = paged_logits(kept, ids, 4), paged_logits(ref, ids, len(ids))
    # The core types' kernels round activations to 16 bits (ops/quant/quant.c): ~1e-4 of drift.
    assert (ours - theirs).norm() / theirs.norm() < 1e-3
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
