"""Writes a random-weight F16 GGUF of a benchmark shape (the 8B or the TinyLlama shape) in a few
minutes: the fixture writer's names, metadata and tokenizer (mlxr/testing/fixtures.py), but the
matrices drawn on the GPU (numpy's generator takes far longer for 7.2B values) and no HF
directory. llama-quantize then makes the Q4_K_M and Q8_0 files from it.

  python bench/gpu/write_shape_gguf.py llama3-8b-shape /root/sbs/8b/model-f16.gguf
"""
from __future__ import annotations

import sys
import time

import gguf
import torch

from mlxr.testing import fixture_tokenizer as ft
from mlxr.testing import fixtures as fx

SHAPES = {
    "llama3-8b-shape": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                            max_position_embeddings=8192, torch_dtype="bfloat16"),
    "tinyllama-shape": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                            num_attention_heads=32, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                            torch_dtype="bfloat16"),
}
# The same shapes with a 32k context, for the long-context bench (random weights: no quality to keep).
SHAPES.update({f"{k}-32k": {**v, "max_position_embeddings": 32768} for k, v in list(SHAPES.items())})


def main(name: str, out: str) -> None:
    t0 = time.perf_counter()
    spec = fx.FixtureSpec("llama", fx._llama_config(**SHAPES[name]), ft.LLAMA, weight_std=0.02,
                          safetensors_dtype="BF16", gguf_type="f16")
    qtype, ftype = fx.GGUF_TYPES["f16"]
    tok = ft.build_tokenizer(spec.tokenizer, spec.config["vocab_size"])
    params = fx.hf_params(spec)
    conv = fx.HFToGGUF(spec.config)
    writer = gguf.GGUFWriter(out, conv.arch_name)
    extras = conv.extra_tensors()
    for p in params:
        fx._add_info(writer, conv.gguf_name(p.name), p.shape, qtype)
    for gname, value in extras:
        fx._add_info(writer, gname, value.shape, qtype)
    fx._gguf_metadata(writer, spec, conv, tok, ftype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    for p in params:
        if p.kind == "matrix":
            # iid draws: llama.cpp's q/k row permutation (conv.convert) would leave them iid, so it is skipped
            writer.write_tensor_data((torch.randn(p.shape, generator=g, device=device) * spec.weight_std)
                                     .half().cpu().numpy())
        else:
            writer.write_tensor_data(fx._gguf_encode(conv.convert(p.name, fx.make_weight(spec, p)), qtype))
    for _, value in extras:
        writer.write_tensor_data(fx._gguf_encode(value, qtype))
    writer.close()
    print(f"wrote {out} in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main(*sys.argv[1:3])
