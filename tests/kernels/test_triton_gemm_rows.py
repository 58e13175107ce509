"""The Triton batch product (mlxr/ops/linear/gemm_rows_triton.py) against an fp64 ground truth: on the
CPU interpreter without CUDA (fp16: the interpreter multiplies bf16 tiles as raw integers), on
the GPU (`gpu`) in both 16-bit types; its measured configuration table; and the dispatcher."""
from __future__ import annotations

import pytest
import torch
from triton_grid import DEVICES  # first: it picks the interpreter before a kernel module loads

from mlxr.ops.linear.gemm_rows_triton import MAX_ROWS, MIN_ROWS, gemm_rows_triton, rows_config  # noqa: E402
from mlxr.ops.linear.linear import linear  # noqa: E402


def cases(device: str) -> list[tuple[int, int, int, dict]]:
    """(m, n, k, config): rows below the tile, ragged n, k a multiple of block_k and not."""
    small = dict(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2)
    if device == "cpu":
        return [(5, 40, 64, small), (16, 33, 96, small), (20, 16, 50, {**small, "block_m": 32})]
    return [(m, n, k, rows_config(m, n, k, vocab=n > 16384) or dict(block_m=64, block_n=32, block_k=128, num_warps=4, num_stages=3))
            for m in (33, 64) for n, k in ((2560, 2048), (2048, 2048), (32000, 2048), (1001, 1000))]


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_rows_matches_fp64(device):
    dtypes = [torch.float16] if device == "cpu" else [torch.bfloat16, torch.float16]
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        for m, n, k, cfg in cases(device):
            x = torch.randn(m, k, generator=g).to(dtype)
            w = torch.randn(n, k, generator=g).to(dtype)
            want = x.double() @ w.double().T
            out = torch.full((m, n), float("nan"), dtype=dtype, device=device)  # poisoned
            got = gemm_rows_triton(x.to(device), w.to(device), out, **cfg)
            assert not got.isnan().any(), "unwritten output"
            err = (got.double().cpu() - want).abs().max() / want.abs().max()
            assert err < 1e-2, (dtype, m, n, k, err.item())  # one 16-bit rounding of the result


def test_the_table_keeps_cublas_where_it_was_measured_ahead():
    """TinyLlama's shapes at 64 rows: q/k/v, o and lm_head take the kernel; gate/up and down,
    where cuBLAS streamed the weights faster, do not; nor does a large model's merged gate/up,
    as wide as a vocabulary but no lm_head; nor do batches outside one row tile."""
    assert rows_config(64, 2560, 2048) and rows_config(64, 2048, 2048) and rows_config(64, 32000, 2048, vocab=True)
    assert rows_config(64, 11264, 2048) is None and rows_config(64, 2048, 5632) is None
    assert rows_config(64, 28672, 4096) is None and rows_config(64, 32000, 2048) is None
    assert rows_config(MIN_ROWS - 1, 2048, 2048) is None and rows_config(MAX_ROWS + 1, 2048, 2048) is None


@pytest.mark.gpu
def test_the_dispatcher_takes_the_kernel_for_a_decode_batch(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the batch kernel is dispatched on Hopper only")
    import mlxr.ops.linear.gemm_rows_triton as mod

    calls = []
    real = mod.gemm_rows_triton
    monkeypatch.setattr(mod, "gemm_rows_triton", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    for m in (8, 48, 64, 96):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), w.float())
        assert ((linear(x, w).float() - ref).abs().max() / ref.abs().max()).item() < 1e-2
    assert calls == [(48, 2048), (64, 2048)]
    calls.clear()
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    wide = torch.randn(32000, 2048, device="cuda", dtype=torch.bfloat16)
    linear(x, wide)
    assert calls == []  # a wide matrix that is not the lm_head stays on cuBLAS
    linear(x, wide, vocab=True)
    assert calls == [(64, 2048)]


def test_llama_models_mark_their_lm_head():
    from mlxr.layers.linear import VocabProjection
    from mlxr.model_config import ModelArgs
    from mlxr.models.llama import LlamaForCausalLM

    args = ModelArgs(model_type="llama", vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    assert isinstance(LlamaForCausalLM(args).lm_head, VocabProjection)
