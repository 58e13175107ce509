"""--kv-cache-dtype through the engine: the same memory budget holds more blocks as the format
shrinks (bytes per block), the paged forward over each format stays near the float32 cache's
logits, OLLAMA_KV_CACHE_TYPE picks the format when nothing else does, and the disk tier keeps
each format's blocks apart (a block of another format is never read as this one's)."""
from __future__ import annotations

import pytest
import torch

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from mlxr.config import EngineConfig
from mlxr.errors import InvalidParameterError
from paged_probe import paged_logits, rel_err

BUDGET_GB = 0.01
IDS = list(range(3, 140))  # a prefill over 8 blocks and a few decode steps


@pytest.fixture(scope="module")
def model() -> str:
    return str(fixture_model("tp-llama").hf_dir)  # head dim 128: a multiple of the packed block's 32


def engine(model: str, kv_cache_dtype: str, **kwargs) -> LLM:
    return LLM(model, dtype=torch.float32, kv_cache_dtype=kv_cache_dtype, kv_cache_memory_gb=BUDGET_GB,
               max_num_seqs=256, warm_up=False, **kwargs)


@pytest.fixture(scope="module")
def engines(model):
    llms = {name: engine(model, name) for name in ("auto", "bf16", "fp16", "fp8", "q8_0", "q4_0")}
    yield llms
    for llm in llms.values():
        llm.shutdown()


def core(llm: LLM):
    return llm.engine.core.core


def test_block_count_grows_with_the_format_for_the_same_memory(engines):
    blocks = {name: core(llm).num_blocks for name, llm in engines.items()}
    # tp-llama: 2 layers x K|V x 2 KV heads x 16 tokens = 128 rows a block, of 128 values each
    row_bytes = {"auto": 512, "bf16": 256, "fp16": 256, "fp8": 136, "q8_0": 136, "q4_0": 72}
    for name, n in blocks.items():
        assert n == int(BUDGET_GB * (1 << 30)) // (128 * row_bytes[name]), name
        assert core(engines[name]).kv.blocks.element_size() * core(engines[name]).kv.blocks[0, 0, 0].numel() \
            == 16 * 2 * row_bytes[name]
    assert blocks["bf16"] >= 2 * blocks["auto"]
    assert blocks["q8_0"] >= 3.7 * blocks["auto"] and blocks["q4_0"] >= 7.1 * blocks["auto"]


# Measured on this random-weight model: bf16 0.007, fp16 0.0008, fp8 0.093, q8_0 0.021, q4_0 0.34
# (its logits amplify K/V rounding far more than a trained model's; the bundled models'
# perplexity is in bench/kv_dtypes.py).
@pytest.mark.parametrize("name,bound", [("bf16", 0.015), ("fp16", 0.002), ("fp8", 0.15), ("q8_0", 0.04),
                                        ("q4_0", 0.5)])
def test_paged_logits_over_each_format_stay_near_the_float32_cache(engines, name, bound):
    want = paged_logits(engines["auto"], IDS, 128)
    err = rel_err(paged_logits(engines[name], IDS, 128), want)
    assert err < bound, err
    assert err > 0.0  # the format was in use: some rounding shows


def test_ollama_kv_cache_type_is_the_default(monkeypatch):
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "f16")
    assert EngineConfig().kv_cache_dtype == "fp16"
    assert EngineConfig(kv_cache_dtype="q4_0").kv_cache_dtype == "q4_0"  # an explicit choice wins
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "Q8_0")
    assert EngineConfig().kv_cache_dtype == "q8_0"
    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "q5_1")
    with pytest.raises(InvalidParameterError, match="OLLAMA_KV_CACHE_TYPE"):
        EngineConfig()
    monkeypatch.delenv("OLLAMA_KV_CACHE_TYPE")
    assert EngineConfig().kv_cache_dtype == "auto"
    with pytest.raises(InvalidParameterError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int3")


def test_a_packed_format_needs_a_head_dim_of_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        LLM(str(fixture_model("tiny-llama").hf_dir), dtype=torch.float32, kv_cache_dtype="q8_0", warm_up=False)


@pytest.mark.slow  # ~25 s a first engine on a fresh directory, 110 s on the shared 2-core host
def test_disk_tier_serves_a_format_its_own_blocks_only(model, tmp_path):
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    first = engine(model, "q8_0", kv_cache_dir=str(tmp_path))
    want = first.generate([IDS], greedy)[0].outputs[0].token_ids
    first.shutdown()
    assert len(list(tmp_path.glob("*/*.kvb"))) >= len(IDS) // 16
    for name, hits in (("auto", 0), ("q4_0", 0), ("q8_0", len(IDS) // 16)):
        llm = engine(model, name, kv_cache_dir=str(tmp_path), kv_cache_preload=0.0)
        try:
            got = llm.generate([IDS], greedy)[0].outputs[0].token_ids
            assert llm.engine.stats().kv_tiers["disk"]["hits"] == hits, name
            if name == "q8_0":
                assert got == want  # the restored blocks are the computed ones
        finally:
            llm.shutdown()


@pytest.mark.slow  # two processes
def test_tensor_parallel_ranks_store_the_same_format(model):
    """Every rank allocates its heads' cache in rank 0's format: a TP-2 engine with q8_0 KV scores
    a prompt as one device with q8_0 KV does (and holds its blocks)."""
    one = engine(model, "q8_0", engine_process=False)
    want = [t.logprob for t in one.engine.score_prompt(IDS, 0)[1]]
    blocks = core(one).num_blocks
    one.shutdown()
    llm = engine(model, "q8_0", tensor_parallel_size=2)
    try:
        got = [t.logprob for t in llm.engine.score_prompt(IDS, 0)[1]]
    finally:
        llm.shutdown()
    assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) < 1e-3
    assert blocks >= 3.7 * int(BUDGET_GB * (1 << 30)) // (128 * 512)


def test_serve_flag_wins_over_the_ollama_variable(monkeypatch, capsys):
    from mlxr.cli.main import build_parser
    from mlxr.cli.serve import server_config

    monkeypatch.setenv("OLLAMA_KV_CACHE_TYPE", "q4_0")
    parser, _ = build_parser()
    assert server_config(parser.parse_args(["serve", "--kv-cache-dtype", "bf16"]), (), ()).engine.kv_cache_dtype \
        == "bf16"
    assert server_config(parser.parse_args(["serve"]), (), ()).engine.kv_cache_dtype == "q4_0"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--kv-cache-dtype", "q5_k"])
    assert "q5_k" in capsys.readouterr().err
