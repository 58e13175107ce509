"""A restart's warm start: the disk tier's most recently used blocks are loaded into the device
cache while the engine starts, bounded by kv_cache_preload, so the first request finds its
prefix there; files that fail their checks are skipped and recomputed."""
from __future__ import annotations

import pytest

import torch

from test_kv_tiers import FULL_BLOCKS, PROMPT, corrupt, fill_cache, model, reference, run  # noqa: F401
from mlxr import LLM


def started(model: str, cache_dir, **kwargs) -> LLM:
    return LLM(model, dtype=torch.float32, kv_cache_dir=str(cache_dir), **kwargs)


def test_preloaded_prefix_is_a_device_hit(model, reference, tmp_path):
    fill_cache(model, tmp_path)
    llm = started(model, tmp_path)
    try:
        before = llm.engine.stats()
        disk = before.kv_tiers["disk"]
        assert disk["preloaded_blocks"] == FULL_BLOCKS and disk["hits"] == FULL_BLOCKS
        assert before.kv_blocks_cached == FULL_BLOCKS and before.kv_blocks_used == 0
        assert run(llm) == reference
        after = llm.engine.stats()
        assert after.kv_tiers["disk"]["hits"] == FULL_BLOCKS  # nothing more read for the request
        assert after.prefix_cache_hit_tokens == FULL_BLOCKS * 16
    finally:
        llm.shutdown()


def test_preload_is_bounded_by_its_fraction_of_the_cache(model, reference, tmp_path):
    fill_cache(model, tmp_path)
    llm = started(model, tmp_path, num_kv_blocks=40, kv_cache_preload=0.1)  # at most 4 blocks
    try:
        assert llm.engine.stats().kv_tiers["disk"]["preloaded_blocks"] == 4
        assert run(llm) == reference  # the rest of the chain still comes from disk or is computed
    finally:
        llm.shutdown()
    off = started(model, tmp_path, kv_cache_preload=0.0)
    try:
        assert off.engine.stats().kv_tiers["disk"]["preloaded_blocks"] == 0
        assert off.engine.stats().kv_blocks_cached == 0
    finally:
        off.shutdown()


def test_a_corrupt_file_is_skipped_by_the_preload(model, reference, tmp_path, caplog):
    files = fill_cache(model, tmp_path)
    corrupt(files[5])
    llm = started(model, tmp_path)
    try:
        disk = llm.engine.stats().kv_tiers["disk"]
        assert disk["skipped_files"] == 1 and disk["preloaded_blocks"] == FULL_BLOCKS - 1
        assert any("skipping" in r.message and files[5].name in r.message for r in caplog.records)
        assert run(llm) == reference  # block 5 on is computed again
        assert llm.engine.stats().prefix_cache_hit_tokens == 5 * 16
    finally:
        llm.shutdown()


def test_preloaded_blocks_are_evicted_like_cached_ones(model, reference, tmp_path):
    """With a small cache, other prompts take the preloaded blocks' room; the output stays right."""
    fill_cache(model, tmp_path)
    llm = started(model, tmp_path, num_kv_blocks=24)
    try:
        assert llm.engine.stats().kv_tiers["disk"]["preloaded_blocks"] == 12
        other = list(range(300, 500))
        run(llm, other)
        run(llm, list(range(310, 510)))
        assert run(llm) == reference
    finally:
        llm.shutdown()


@pytest.mark.slow  # two server starts, ~10 s; the preload tests above run in-process every time
def test_restarted_server_preloads_and_reports_it(tmp_path):
    """`mlxr serve --kv-cache-dir`: a second server on the first one's directory starts with the
    prompt's blocks on the device (/metrics and /admin/stats say how many) and answers the same;
    `--kv-cache-preload 0` starts with none."""
    import httpx
    import openai

    from model_fixtures import fixture_model
    from server_harness import running_server
    from test_kv_tiers_process import tier_metric

    gguf = str(fixture_model("tiny-llama").gguf_path)
    args = ("--model", gguf, "--kv-cache-dir", str(tmp_path / "kv"))
    texts = []
    for i, extra in enumerate(((), (), ("--kv-cache-preload", "0"))):
        with running_server(tmp_path / f"home{i}", *args, *extra) as url:
            metrics = httpx.get(url + "/metrics").text
            preloaded = tier_metric(metrics, "mlxr:kv_tier_preloaded_blocks", "disk")
            assert preloaded == (0 if i != 1 else FULL_BLOCKS), (i, preloaded)
            client = openai.OpenAI(base_url=url + "/v1", api_key="none")
            name = client.models.list().data[0].id
            texts.append(client.completions.create(model=name, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text)
            stats = next(iter(httpx.get(url + "/admin/stats").json()["models"].values()))
            assert stats["kv_tiers"]["disk"]["preloaded_blocks"] == preloaded
    assert texts[0] == texts[1] == texts[2]


def test_preload_stops_at_its_time_budget(model, reference, tmp_path, monkeypatch, caplog):
    from mlxr.engine.kv import preload as kv_preload

    fill_cache(model, tmp_path)
    monkeypatch.setattr(kv_preload, "PRELOAD_BUDGET_S", 0.0)
    llm = started(model, tmp_path)
    try:
        assert llm.engine.stats().kv_tiers["disk"]["preloaded_blocks"] == 0
        assert any("budget" in r.message for r in caplog.records)
        assert run(llm) == reference  # restored on request instead
        assert llm.engine.stats().kv_tiers["disk"]["hits"] == FULL_BLOCKS
    finally:
        llm.shutdown()
