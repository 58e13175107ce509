"""One batch mixes requests of different LoRA adapters and of none: each request's tokens and
logprobs equal the same request run alone; adapters past --max-loras wait for a slot and are
loaded in place of idle ones (LRU); the prefix cache never serves one adapter's blocks to another."""
from __future__ import annotations

import pytest
import torch

from lora_fixtures import peft_adapter
from model_fixtures import fixture_model

from mlxr import LLM, SamplingParams

SPECS = ["r4-qv", "r8-all", "r16-mlp-rslora", "r2-ko"]
PROMPTS = [[7, 300, 45, 99, 12, 250, 3, 77], [180, 31, 64, 400, 9], [11, 222, 5, 88, 123, 301, 17],
           [42, 256, 19, 73, 7, 300], [45, 99, 12, 250, 3, 77, 180, 31, 64]]


def _llm(max_loras: int, **kwargs) -> LLM:
    base = fixture_model("tiny-llama").hf_dir
    llm = LLM(str(base), dtype=torch.float32, enable_lora=True, max_loras=max_loras, **kwargs)
    for spec in SPECS:
        llm.load_lora(spec, str(peft_adapter(base, spec)))
    return llm


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)


def _same(a, b) -> None:
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    got = [next(iter(lp.values())).logprob if isinstance(lp, dict) else lp for lp in a.outputs[0].logprobs]
    want = [next(iter(lp.values())).logprob if isinstance(lp, dict) else lp for lp in b.outputs[0].logprobs]
    assert got == pytest.approx(want, abs=1e-4)


@pytest.fixture(scope="module")
def llm4():
    llm = _llm(4)
    yield llm
    llm.shutdown()


def test_mixed_batch_equals_each_request_alone(llm4):
    loras = SPECS + [None]
    together = llm4.generate(PROMPTS, _params(), lora=loras)
    alone = [llm4.generate([p], _params(), lora=name)[0] for p, name in zip(PROMPTS, loras)]
    for a, b in zip(together, alone):
        _same(a, b)
    # and the adapters matter: the same prompt under each gives different tokens or figures
    same_prompt = llm4.generate([PROMPTS[0]] * 5, _params(), lora=loras)
    assert len({tuple(o.outputs[0].token_ids) for o in same_prompt}) > 1


def test_more_adapters_than_slots_wait_and_evict_idle_ones():
    llm = _llm(2)
    try:
        loras = SPECS + [None, SPECS[0]]
        prompts = PROMPTS + [PROMPTS[1]]
        together = llm.generate(prompts, _params(), lora=loras)
        llm.engine.step()  # the runner hears of the last finishes in the next step
        assert llm.engine.core.core.runner.lora.holders == [0, 0]  # every slot idle again
        ref = _llm(4)
        try:
            alone = [ref.generate([p], _params(), lora=name)[0] for p, name in zip(prompts, loras)]
        finally:
            ref.shutdown()
        for a, b in zip(together, alone):
            _same(a, b)
    finally:
        llm.shutdown()


def test_prefix_cache_keys_include_the_adapter(llm4):
    prompt = list(range(3, 3 + 40))  # two full blocks of 16 and more
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    first = llm4.generate([prompt], params, lora="r8-all")[0]
    again = llm4.generate([prompt], params, lora="r8-all")[0]
    other = llm4.generate([prompt], params, lora="r4-qv")[0]
    base = llm4.generate([prompt], params)[0]
    base_again = llm4.generate([prompt], params)[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == 32  # its own blocks, found again
    assert other.num_cached_tokens == 0 and base.num_cached_tokens == 0  # never another adapter's
    assert base_again.num_cached_tokens == 32
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_unknown_adapter_is_a_not_found_error(llm4):
    from mlxr.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="nope"):
        llm4.generate([PROMPTS[0]], _params(), lora="nope")


@pytest.mark.slow
def test_adapters_in_a_core_process_equal_the_in_process_engine(llm4):
    """The core in its own process (CUDA's default): load, generate and unload go over its channel."""
    base = fixture_model("tiny-llama").hf_dir
    llm = LLM(str(base), dtype=torch.float32, enable_lora=True, engine_process=True, warm_up=False,
              lora_modules=(("r8-all", str(peft_adapter(base, "r8-all"))),))
    try:
        llm.load_lora("r2-ko", str(peft_adapter(base, "r2-ko")))
        assert sorted(llm.engine.lora_names) == ["r2-ko", "r8-all"]
        loras = ["r8-all", "r2-ko", None]
        got = llm.generate(PROMPTS[:3], _params(), lora=loras)
        want = llm4.generate(PROMPTS[:3], _params(), lora=loras)
        for a, b in zip(got, want):
            _same(a, b)
        llm.unload_lora("r2-ko")
        from mlxr.errors import AdapterError, ModelNotFoundError

        with pytest.raises(ModelNotFoundError):
            llm.unload_lora("r2-ko")
        with pytest.raises(AdapterError, match="already been loaded"):
            llm.load_lora("r8-all", str(peft_adapter(base, "r8-all")))
    finally:
        llm.shutdown()


@pytest.mark.gpu
def test_mixed_batch_on_cuda_equals_each_request_alone():
    """Triton's gathered kernels inside the decode CUDA graphs (each row's slot from their buffer),
    a mixed batch replaying the same graphs as a request alone."""
    llm = _llm(4, device="cuda", engine_process=False)
    try:
        loras = SPECS + [None]
        together = llm.generate(PROMPTS, _params(), lora=loras)
        alone = [llm.generate([p], _params(), lora=name)[0] for p, name in zip(PROMPTS, loras)]
        for a, b in zip(together, alone):
            _same(a, b)
    finally:
        llm.shutdown()
