"""The CUDA path (CUDA graphs, and the Triton kernels where dispatched) against the CPU
reference path. Marked gpu: skipped without CUDA."""
from __future__ import annotations

import pytest

from conftest import fixture_model
from mlxr import LLM, SamplingParams

pytestmark = pytest.mark.gpu
PROMPTS = [list(range(5, 5 + n)) for n in (3, 17, 40, 64, 9, 33, 1, 100)]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_fp32_greedy_tokens_match_cpu_reference(name):
    path = str(fixture_model(name).hf_dir)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    cpu = LLM(path, dtype="float32", device="cpu").generate(PROMPTS, params)
    gpu_llm = LLM(path, dtype="float32", device="cuda")
    assert gpu_llm.engine.runner.graphs is not None and gpu_llm.engine.runner.graphs.graphs
    gpu = gpu_llm.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in gpu] == [o.outputs[0].token_ids for o in cpu]


def test_graph_replay_equals_eager_logits():
    path = str(fixture_model("tiny-llama").hf_dir)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=5)
    eager = LLM(path, dtype="float32", device="cuda", enable_cuda_graphs=False).generate(PROMPTS, params)
    graph = LLM(path, dtype="float32", device="cuda").generate(PROMPTS, params)
    for a, b in zip(eager, graph):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            tok = next(iter(la))
            assert la[tok].logprob == pytest.approx(lb[tok].logprob, abs=1e-4)
