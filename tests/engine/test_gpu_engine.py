"""The CUDA path (CUDA graphs, and the Triton kernels where dispatched) against the CPU
reference path. Marked gpu: skipped without CUDA."""
from __future__ import annotations

import pytest

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams

pytestmark = pytest.mark.gpu
PROMPTS = [list(range(5, 5 + n)) for n in (3, 17, 40, 64, 9, 33, 1, 100)]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_fp32_greedy_tokens_match_cpu_reference(name):
    path = str(fixture_model(name).hf_dir)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    cpu = LLM(path, dtype="float32", device="cpu").generate(PROMPTS, params)
    gpu_llm = LLM(path, dtype="float32", device="cuda")
    assert gpu_llm.engine.core.core.runner.graphs is not None and gpu_llm.engine.core.core.runner.graphs.graphs
    gpu = gpu_llm.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in gpu] == [o.outputs[0].token_ids for o in cpu]


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_graph_replay_equals_eager_logits(kernels, monkeypatch):
    monkeypatch.setenv("MLXR_KERNELS", kernels)  # graphs must capture either attention path
    path = str(fixture_model("tiny-llama").hf_dir)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
    eager_llm = LLM(path, dtype="float32", device="cuda", enable_cuda_graphs=False)
    graph_llm = LLM(path, dtype="float32", device="cuda")
    # A batch of 8, and one sequence alone (the batch-1 graph).
    eager = eager_llm.generate(PROMPTS, params) + eager_llm.generate(PROMPTS[1:2], params)
    graph = graph_llm.generate(PROMPTS, params) + graph_llm.generate(PROMPTS[1:2], params)
    for a, b in zip(eager, graph):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            tok = next(iter(la))
            assert la[tok].logprob == pytest.approx(lb[tok].logprob, abs=1e-4)


@pytest.mark.parametrize("name, n, fused", [("tiny-gemma3", 512, False), ("tiny-llama3", 512, True),
                                             ("tiny-qwen2", 256, True)])
def test_bf16_teacher_forced_top1_agrees_with_reference(name, n, fused, monkeypatch):
    """bf16 on the GPU with the Triton kernels and CUDA graphs against the bf16 torch
    reference path on the same GPU: n/2 prompt positions, then n/2 decode steps (512 where the
    model's positions allow). Llama and Qwen2 (q/k/v biases) decode through the fused
    projection + rope + cache-write kernel; Gemma 3's per-head norms keep it unfused."""
    import torch

    import mlxr.ops.rotary.qkv_rope_triton as fused_module
    from paged_probe import paged_logits

    path = str(fixture_model(name).hf_dir)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (n,), generator=g).tolist()
    monkeypatch.setenv("MLXR_KERNELS", "reference")
    ref = paged_logits(LLM(path, dtype="bfloat16", device="cuda", enable_cuda_graphs=False), ids, n // 2)
    monkeypatch.setenv("MLXR_KERNELS", "auto")
    calls = []
    kernel = fused_module.qkv_rope_triton
    monkeypatch.setattr(fused_module, "qkv_rope_triton", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    fast = LLM(path, dtype="bfloat16", device="cuda")
    assert fast.engine.core.core.runner.graphs is not None
    assert bool(calls) == fused, "the batch-1 graph captures the fused kernel exactly where it applies"
    ours = paged_logits(fast, ids, n // 2)
    fp32 = paged_logits(LLM(path, dtype="float32", device="cpu"), ids, n // 2)
    hit = lambda a, b: (a.cpu().argmax(-1) == b.cpu().argmax(-1))  # noqa: E731
    top2 = fp32.topk(2, -1).values
    # A random-weight model has many near-ties (17% of positions within 0.05 here), where any
    # bf16 rounding flips the argmax: judge agreement where fp32 has a margin over bf16 noise.
    clear = (top2[:, 0] - top2[:, 1]) > 0.05
    print(f"top-1 agreement, all positions: triton vs reference {hit(ours, ref).float().mean():.4f}, "
          f"triton vs fp32 {hit(ours, fp32).float().mean():.4f}, reference vs fp32 "
          f"{hit(ref, fp32).float().mean():.4f}; clear positions {clear.float().mean():.3f}")
    assert hit(ours, ref)[clear].float().mean().item() >= 0.99
    assert hit(ours, fp32)[clear].float().mean().item() >= 0.99
    # The kernels are no further from fp32 than the bf16 reference path is.
    assert hit(ours, fp32).float().mean() >= hit(ref, fp32).float().mean() - 0.01


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_gguf_q8_0_model_on_gpu_matches_its_dequantized_run(graphs):
    """Weights kept as Q8_0 blocks (Triton GEMV for decode, dequantize + cuBLAS for prefill)
    against the same file dequantized at load, both with fp32 activations."""
    from paged_probe import paged_logits, rel_err

    path = str(fixture_model("tiny-llama", "q8_0").gguf_path)
    ids = list(range(5, 90))
    quant = LLM(path, device="cuda", dtype="float32", max_num_seqs=4, enable_cuda_graphs=graphs)
    assert quant.loaded.quantization == "gguf"
    ref = LLM(path, device="cuda", dtype="float32", quantization="none", max_num_seqs=4)
    assert rel_err(paged_logits(quant, ids, 40), paged_logits(ref, ids, 40)) < 1e-4


def test_overlapped_steps_match_synchronous_steps_on_the_gpu(monkeypatch):
    """On CUDA step N+1 is queued before step N's tokens reach the host (the default); with
    staggered arrivals, seeds and stop strings the outputs equal the synchronous engine's.
    Steady steps (the same batch one token on) fill their graph from host arrays."""
    from test_engine_e2e import random_requests, staggered

    from mlxr.engine.worker.cuda_graphs import DecodeGraphs

    path = str(fixture_model("tiny-llama").hf_dir)
    sync = LLM(path, dtype="float32", device="cuda", overlap_steps=False, max_num_seqs=8)
    fast = LLM(path, dtype="float32", device="cuda", max_num_seqs=8)
    assert fast.engine.core.core.overlap
    steady_batches = []
    run_steady = DecodeGraphs.run_steady
    monkeypatch.setattr(DecodeGraphs, "run_steady",
                        lambda self, a, tokens: steady_batches.append(len(a.request_ids)) or run_steady(self, a, tokens))
    reqs = random_requests(20, seed=7)
    assert staggered(fast, reqs)[0] == staggered(sync, reqs)[0]
    params = SamplingParams(max_tokens=20, temperature=0.8, seed=5, stop=["a", "e"], logprobs=2)
    a, b = fast.generate(PROMPTS, params), sync.generate(PROMPTS, params)
    assert [(o.outputs[0].text, o.outputs[0].token_ids) for o in a] == [(o.outputs[0].text, o.outputs[0].token_ids) for o in b]
    assert fast.engine.stats().kv_blocks_used == 0
    assert 8 in steady_batches and len(set(steady_batches)) > 2, "padded sizes (3 -> 4, ...) included"


def test_prefill_graphs_equal_eager_prefill():
    """One sequence's prompt chunks replay graphs at padded token counts: the tokens and
    logprobs equal the eager path's, for lengths around the buckets, a cached prefix and
    chunked prompts."""
    path = str(fixture_model("tiny-llama").hf_dir)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3)
    eager = LLM(path, dtype="float32", device="cuda", enable_prefill_graphs=False)
    fast = LLM(path, dtype="float32", device="cuda")
    chunked = LLM(path, dtype="float32", device="cuda", max_num_batched_tokens=64)
    assert fast.engine.core.core.runner.prefill_graphs.graphs and eager.engine.core.core.runner.prefill_graphs is None
    prompts = [list(range(5, 5 + n)) for n in (2, 63, 64, 65, 200)] + [list(range(5, 69)) + [7, 8, 9]]
    for prompt in prompts:  # one at a time, so each prompt is a one-sequence chunk
        want = eager.generate([prompt], params)[0].outputs[0]
        for llm in (fast, chunked):
            got = llm.generate([prompt], params)[0].outputs[0]
            assert got.token_ids == want.token_ids
            for a, b in zip(got.logprobs, want.logprobs):
                tok = next(iter(b))
                assert a[tok].logprob == pytest.approx(b[tok].logprob, abs=1e-4)
    assert fast.engine.stats().prefix_cache_hit_tokens > 0
