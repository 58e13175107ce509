"""The engine core's warm-up: it leaves no trace in the cache or the counters, changes no
output, and afterwards (on a GPU) serving compiles no kernel."""
from __future__ import annotations

import pytest
import torch

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


def test_warm_up_leaves_no_trace_and_changes_no_output(model_dir):
    warm = LLM(model_dir, dtype="float32")
    cold = LLM(model_dir, dtype="float32", warm_up=False)
    stats = warm.engine.stats()
    assert stats.kv_blocks_used == stats.kv_blocks_cached == 0
    assert stats.prefix_cache_queried_tokens == stats.num_preemptions == stats.prompt_tokens_total == 0
    params = SamplingParams(max_tokens=10, temperature=0.0)
    prompts = ["Once upon a time", [5, 6, 7]]
    assert [o.outputs[0].token_ids for o in warm.generate(prompts, params)] == \
           [o.outputs[0].token_ids for o in cold.generate(prompts, params)]


def test_another_engines_warm_up_is_not_counted_as_serving():
    from mlxr.engine.core.compile_watch import CompileWatch

    watch = CompileWatch()
    watch.mark_warm()  # a first engine is serving
    watch.warming()  # a second one warms up in the same process
    watch._count("k(x)")
    watch.mark_warm()
    assert (watch.total, watch.after_warm_up) == (1, 0)


def test_an_engine_without_warm_up_does_not_count_its_compiles_as_misses(model_dir):
    """Compiles are expected from an engine built with warm_up=False, even after another
    engine of the process declared itself warm (the GPU test run logged dozens of false misses)."""
    from mlxr.engine.core.compile_watch import WATCH

    LLM(model_dir, dtype="float32")
    assert WATCH.warm
    LLM(model_dir, dtype="float32", warm_up=False)
    assert not WATCH.warm


def test_a_compile_after_the_warm_up_is_counted_and_logged(caplog):
    from mlxr.engine.core.compile_watch import CompileWatch

    watch = CompileWatch()
    watch._count("k_early(x)")
    watch.mark_warm()
    with caplog.at_level("WARNING"):
        watch._count("k_late(x: i32)")
    assert (watch.total, watch.after_warm_up) == (2, 1)
    assert "k_late" in caplog.text and "while serving" in caplog.text


@pytest.mark.gpu
@pytest.mark.xfail(reason="on an H100 it passed alone on a fresh machine but failed after the other GPU tests "
                          "in one process (2026-11-24); the spec-decode bench logged late _qkv_rope_kernel and "
                          "_decode_partition_kernel variants: the warm-up does not yet enumerate every "
                          "specialisation", strict=False)
def test_serving_after_the_warm_up_compiles_nothing():
    """Every shape a mixed workload meets was compiled during the warm-up."""
    import random

    llm = LLM(str(fixture_model("tiny-llama").hf_dir), dtype=torch.bfloat16, device="cuda")
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.choice([1, 3, 30, 77, 130, 200]))] for _ in range(40)]
    params = [SamplingParams(max_tokens=rng.choice([1, 5, 20]), temperature=rng.choice([0.0, 0.8]),
                             logprobs=rng.choice([None, 2])) for _ in prompts]
    llm.generate(prompts, params)
    assert llm.engine.stats().runtime_compiles == 0


def test_the_prefix_hit_wave_runs_on_cuda_only(model_dir):
    """On CUDA the warm-up ends with a prompt and the same prompt plus a question (a prefill at a
    nonzero start over a cached context); the CPU's warm-up stays two tiny requests."""
    import random

    from mlxr.engine.core.warm_up import prefix_hit_prompts

    llm = LLM(model_dir, dtype="float32")
    assert prefix_hit_prompts(llm.engine.core.core, random.Random(0)) == []


@pytest.mark.gpu
def test_the_prefix_hit_wave_extends_its_prompt():
    import random

    from mlxr.engine.core.warm_up import prefix_hit_prompts

    llm = LLM(str(fixture_model("tiny-llama").hf_dir), dtype=torch.bfloat16, device="cuda", engine_process=False)
    first, second = prefix_hit_prompts(llm.engine.core.core, random.Random(0))
    assert second[: len(first)] == first and len(second) == len(first) + 29 and len(first) >= 64


def test_a_wave_prefills_a_batch_of_rows_off_the_multiples_of_16(model_dir):
    """On CUDA the logits rows of a prefill of 33..63 requests take the Triton batch product,
    whose kernel Triton specialises on the row count being a multiple of 16; a prefill wave of
    such a count compiles that variant before serving (without it the H200 sweep's batch-256
    prefill compiled it while serving)."""
    from types import SimpleNamespace

    from mlxr.engine.core.warm_up import waves
    from mlxr.ops.linear.gemm_rows_triton import MAX_ROWS, MIN_ROWS

    llm = LLM(model_dir, dtype="float32")
    core = llm.engine.core.core
    as_cuda = SimpleNamespace(max_model_len=core.max_model_len, config=core.config,
                              parts=SimpleNamespace(device=torch.device("cuda")))
    sizes = {len(w) for w in waves(as_cuda)}
    assert any(MIN_ROWS <= n <= MAX_ROWS and n % 16 for n in sizes), sizes


def test_triton_kernels_are_cached_in_a_versioned_folder_of_the_mlxr_cache(monkeypatch, tmp_path):
    """A restart finds what the first start compiled: the folder is stable (MLXR_CACHE_DIR) and
    named by Triton's version; a TRITON_CACHE_DIR the user set wins."""
    import triton

    from mlxr.engine.core.compile_watch import use_kernel_cache

    monkeypatch.setenv("MLXR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    use_kernel_cache()
    import os

    want = tmp_path / "triton" / triton.__version__
    assert os.environ["TRITON_CACHE_DIR"] == str(want) and want.is_dir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    use_kernel_cache()
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def test_compile_seconds_are_summed():
    from mlxr.engine.core.compile_watch import CompileWatch

    watch = CompileWatch()
    watch._count("a(x)", 1.5)
    watch._count("b(x)", 0.25)
    assert (watch.total, watch.seconds) == (2, 1.75)
