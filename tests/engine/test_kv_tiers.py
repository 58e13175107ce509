"""KV cache tiers in this process: the host tier after churn, and the disk tier's faults (a
corrupt, truncated or other model's file, a full disk), each on real files written by one
engine and read by a new one, with the output compared to an engine without tiers."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPT = list(range(5, 205))  # 12 full blocks of 16, then a partial one
FULL_BLOCKS = len(PROMPT) // 16


@pytest.fixture(scope="module")
def model() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


@pytest.fixture(scope="module")
def reference(model) -> list[int]:
    llm = LLM(model, dtype=torch.float32, enable_prefix_caching=False)
    try:
        return llm.generate([PROMPT], GREEDY)[0].outputs[0].token_ids
    finally:
        llm.shutdown()


def tiers(llm: LLM):
    return llm.engine.core.core.tiers


def run(llm: LLM, prompt: list[int] = PROMPT) -> list[int]:
    return llm.generate([prompt], GREEDY)[0].outputs[0].token_ids


def fill_cache(model: str, cache_dir: Path, prompt: list[int] = PROMPT) -> list[Path]:
    """One engine computes the prompt and writes its blocks; returns the files, in block order
    (the block manager publishes them in order, the writer writes them in order)."""
    llm = LLM(model, dtype=torch.float32, kv_cache_dir=str(cache_dir))
    run(llm, prompt)
    llm.shutdown()
    files = sorted(cache_dir.glob("*/*.kvb"), key=lambda p: p.stat().st_mtime_ns)
    assert len(files) >= FULL_BLOCKS
    return files


def restarted(model: str, cache_dir: Path, **kwargs) -> LLM:
    """A new engine on the same directory, restoring blocks when a request asks (no preload at
    start, so these tests see the request's own restore; test_kv_preload.py covers the preload)."""
    return LLM(model, dtype=torch.float32, kv_cache_dir=str(cache_dir), **{"kv_cache_preload": 0.0, **kwargs})


def test_host_tier_churn_then_hit(model, reference):
    # 20 device blocks: the second prompt's 13 blocks push most of the first one's out.
    llm = LLM(model, dtype=torch.float32, num_kv_blocks=20, kv_host_cache_gb=0.01)
    try:
        assert run(llm) == reference
        assert run(llm, list(range(300, 500))) != reference
        assert run(llm) == reference
        stats = llm.engine.stats()
        host = stats.kv_tiers["host"]
        assert host["hits"] >= 5 and host["bytes_read"] == host["hits"] * tiers(llm).block_bytes
        assert host["blocks"] > 0
        assert stats.prefix_cache_hit_tokens == FULL_BLOCKS * 16  # device and host together
    finally:
        llm.shutdown()


def test_host_tier_off_recomputes(model, reference):
    """The same churn without the host tier: the evicted blocks are computed again."""
    llm = LLM(model, dtype=torch.float32, num_kv_blocks=20)
    try:
        run(llm)
        run(llm, list(range(300, 500)))
        assert run(llm) == reference
        assert llm.engine.stats().prefix_cache_hit_tokens < FULL_BLOCKS * 16
    finally:
        llm.shutdown()


def test_disk_restore_in_a_new_engine(model, reference, tmp_path):
    fill_cache(model, tmp_path)
    llm = restarted(model, tmp_path)
    try:
        assert run(llm) == reference
        disk = llm.engine.stats().kv_tiers["disk"]
        assert disk["hits"] == FULL_BLOCKS and disk["skipped_files"] == 0
        assert llm.engine.stats().prefix_cache_hit_tokens == FULL_BLOCKS * 16
    finally:
        llm.shutdown()


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", [corrupt, truncate])
def test_damaged_file_is_skipped_and_recomputed(model, reference, tmp_path, damage, caplog):
    files = fill_cache(model, tmp_path)
    damage(files[5])
    llm = restarted(model, tmp_path)
    try:
        assert run(llm) == reference
        disk = llm.engine.stats().kv_tiers["disk"]
        assert disk["skipped_files"] == 1 and disk["hits"] == 5  # the chain stops at the bad block
        assert any("skipping" in r.message and files[5].name in r.message for r in caplog.records)
        tiers(llm).disk.drain()
        assert len(list(tmp_path.glob("*/*.kvb"))) == len(files)  # rewritten from the recomputed block
    finally:
        llm.shutdown()
    again = restarted(model, tmp_path)
    try:
        assert run(again) == reference
        assert again.engine.stats().kv_tiers["disk"] == {**again.engine.stats().kv_tiers["disk"],
                                                        "hits": FULL_BLOCKS, "skipped_files": 0}
    finally:
        again.shutdown()


def test_file_from_another_model_is_skipped(model, reference, tmp_path):
    ours = fill_cache(model, tmp_path / "ours")
    theirs = fill_cache(str(fixture_model("tiny-llama-tied").hf_dir), tmp_path / "theirs")
    by_name = {p.name: p for p in theirs}
    ours[0].write_bytes(by_name[ours[0].name].read_bytes())  # same tokens, same hash, other weights
    llm = restarted(model, tmp_path / "ours")
    try:
        assert run(llm) == reference
        disk = llm.engine.stats().kv_tiers["disk"]
        assert disk["skipped_files"] == 1 and disk["hits"] == 0
    finally:
        llm.shutdown()


class FullDisk:
    """A writable file that fails like a full file system once `room` bytes are written: the
    OSError comes from the write call, as the OS reports ENOSPC (no tmpfs can be mounted here)."""

    def __init__(self, path, mode: str, room: int) -> None:
        self.file, self.room = open(path, mode), room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def test_full_disk_turns_writes_off_and_loses_nothing(model, reference, tmp_path, caplog):
    fill_cache(model, tmp_path)
    llm = restarted(model, tmp_path)
    try:
        tiers(llm).disk.opener = lambda path, mode: FullDisk(path, mode, room=1000)
        other = list(range(210, 410))
        want = run(llm, other)
        tiers(llm).disk.drain()
        disk = llm.engine.stats().kv_tiers["disk"]
        assert disk["write_errors"] == 1 and disk["writes_enabled"] == 0
        assert any("disk writes are off" in r.message for r in caplog.records)
        assert not list(tmp_path.glob("*/*.tmp"))
        assert run(llm) == reference  # the blocks already on disk still serve
        assert llm.engine.stats().kv_tiers["disk"]["hits"] == FULL_BLOCKS
    finally:
        llm.shutdown()
    plain = LLM(model, dtype=torch.float32, enable_prefix_caching=False)
    try:
        assert run(plain, other) == want
    finally:
        plain.shutdown()


def test_size_bound_evicts_least_recently_used(model, tmp_path):
    llm = LLM(model, dtype=torch.float32, kv_cache_dir=str(tmp_path), kv_cache_disk_gb=0)
    try:
        run(llm)
        tiers(llm).disk.drain()
        assert not list(tmp_path.glob("*/*.kvb"))  # a bound of 0 writes nothing
    finally:
        llm.shutdown()
    bytes_per_file = fill_cache(model, tmp_path / "a")[0].stat().st_size
    bound = 8 * bytes_per_file + bytes_per_file // 2  # headers differ by a few bytes
    llm = LLM(model, dtype=torch.float32, kv_cache_dir=str(tmp_path / "a"), kv_cache_disk_gb=bound / (1 << 30))
    try:
        old = {p.name for p in (tmp_path / "a").glob("*/*.kvb")}
        run(llm, list(range(310, 510)))  # 12 more blocks: the least recently used go
        tiers(llm).disk.drain()
        files = list((tmp_path / "a").glob("*/*.kvb"))
        assert sum(p.stat().st_size for p in files) <= bound and len(files) == 8
        assert tiers(llm).disk.num_blocks == 8 and not old & {p.name for p in files}
    finally:
        llm.shutdown()


def test_host_tier_beside_preemption_swap(model):
    """Swap space and the host tier are separate pools: sequences swapped out under pressure
    and prefix blocks evicted to host memory in the same engine, outputs as without either."""
    prompts = [list(range(5, 105)), list(range(105, 205)), list(range(5, 105))]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    plain = LLM(model, dtype=torch.float32, enable_prefix_caching=False)
    try:
        want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    finally:
        plain.shutdown()
    llm = LLM(model, dtype=torch.float32, num_kv_blocks=16, swap_space_gb=0.01, kv_host_cache_gb=0.01)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert got == want
        assert got == [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        stats = llm.engine.stats()
        assert stats.num_preemptions > 0 and stats.kv_tiers["host"]["hits"] > 0
    finally:
        llm.shutdown()


@pytest.mark.gpu
def test_tiers_on_cuda(model, tmp_path):
    """The side stream and pinned pool: host churn, then a disk restore in a new engine, each
    giving the output of a CUDA engine without tiers."""
    kw = dict(dtype=torch.float32, device="cuda")
    plain = LLM(model, enable_prefix_caching=False, **kw)
    try:
        want = run(plain)
    finally:
        plain.shutdown()
    llm = LLM(model, num_kv_blocks=20, kv_host_cache_gb=0.01, kv_cache_dir=str(tmp_path), **kw)
    try:
        assert run(llm) == want
        run(llm, list(range(300, 500)))
        assert run(llm) == want
        assert llm.engine.stats().kv_tiers["host"]["hits"] >= 5
    finally:
        llm.shutdown()
    again = LLM(model, kv_cache_dir=str(tmp_path), kv_cache_preload=0.0, **kw)  # the request restores, not a preload
    try:
        assert run(again) == want
        assert again.engine.stats().kv_tiers["disk"]["hits"] == FULL_BLOCKS
    finally:
        again.shutdown()
