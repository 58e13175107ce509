"""The KV disk tier survives its directory: each kind of bad entry in place of a block file (a
directory, a FIFO, a symlink, a cut, forged, too deeply nested, missing or old-format file) and a
corrupt index, against a real engine and its real tier. Each is skipped and counted by reason,
the request's text equals an engine's without tiers, and the writer goes on writing."""
from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import kv_dir_damage as damage
from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from mlxr.errors import InvalidParameterError

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPT = list(range(5, 205))  # 12 full blocks of 16, then a partial one
OTHER = list(range(300, 500))
FULL_BLOCKS = len(PROMPT) // 16
BAD = 5  # the block replaced: blocks 0-4 still come from the disk, the chain stops at 5


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


def fill(model: str, cache_dir: Path, prompt: list[int] = PROMPT) -> list[Path]:
    """One engine writes the prompt's blocks; the files in block order."""
    llm = LLM(model, dtype=torch.float32, kv_cache_dir=str(cache_dir))
    llm.generate([prompt], GREEDY)
    llm.shutdown()
    names = [h.hex() + ".kvb" for _, _, h in damage.chain(prompt)]
    layout_dir = next(p for p in cache_dir.iterdir() if p.is_dir())
    return [layout_dir / name for name in names]


@pytest.fixture(scope="module")
def template(model, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kv-template") / "kv"
    fill(model, root)
    return root


@pytest.fixture
def cache(template, tmp_path) -> tuple[Path, list[Path]]:
    root = damage.copy_cache(template, tmp_path / "kv")
    layout_dir = next(p for p in root.iterdir() if p.is_dir())
    return root, [layout_dir / (h.hex() + ".kvb") for _, _, h in damage.chain(PROMPT)]


def bounded(fn: Callable[[], object], timeout_s: float = 60.0) -> object:
    """fn's result, or a failure (not a hung test) when it has not returned in timeout_s."""
    result: dict[str, object] = {}

    def call() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            result["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still running after {timeout_s} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


def restarted(cache_dir: Path, model: str) -> LLM:
    return bounded(lambda: LLM(model, dtype=torch.float32, kv_cache_dir=str(cache_dir), kv_cache_preload=0.0))


def run(llm: LLM, prompt: list[int] = PROMPT) -> list[int]:
    return bounded(lambda: llm.generate([prompt], GREEDY)[0].outputs[0].token_ids)


def disk_figures(llm: LLM) -> dict[str, int]:
    return llm.engine.stats().kv_tiers["disk"]


def writer_keeps_writing(llm: LLM) -> None:
    """The writer thread is alive: it drains, and a new prompt's blocks reach the disk."""
    disk = llm.engine.core.core.tiers.disk
    assert disk.drain(10), "the disk writer did not drain: it is dead or stuck"
    before = disk_figures(llm)["bytes_written"]
    run(llm, OTHER)
    assert disk.drain(10), "the disk writer did not drain: it is dead or stuck"
    assert disk_figures(llm)["bytes_written"] > before and disk.writes_enabled


ENTRIES = [  # (what stands where block BAD's file was, the reason it is counted under)
    (damage.directory, "not_regular"),
    (damage.fifo, "not_regular"),
    (damage.symlink_outside, "symlink"),
    (damage.truncated, "truncated"),
    (damage.deep_header, "corrupt"),
    (damage.missing, "missing"),
    (damage.old_version, "foreign"),
]


@pytest.mark.parametrize(("make", "reason"), ENTRIES, ids=[make.__name__ for make, _ in ENTRIES])
def test_bad_entry_in_place_of_a_block_is_skipped_and_counted(model, reference, cache, make, reason, caplog):
    root, files = cache
    make(files[BAD])
    with caplog.at_level(logging.WARNING):
        llm = restarted(root, model)
        try:
            assert run(llm) == reference
            disk = disk_figures(llm)
            assert disk["hits"] == BAD and disk["skipped_files"] == 1
            assert disk[f"rejected_{reason}"] == 1
            writer_keeps_writing(llm)
        finally:
            bounded(llm.shutdown)
    assert any(files[BAD].name in r.message for r in caplog.records)


def test_unreadable_file_is_skipped_and_counted(model, reference, cache):
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    root, files = cache
    files[BAD].chmod(0)
    llm = restarted(root, model)
    try:
        assert run(llm) == reference
        assert disk_figures(llm)["rejected_unreadable"] == 1
    finally:
        bounded(llm.shutdown)


def test_block_forged_from_another_text_is_refused(model, reference, cache, tmp_path):
    """Every block file of PROMPT is replaced by OTHER's at the same position, renamed (and, where
    the format holds them, given PROMPT's tokens and parents): the chain must not restore."""
    root, files = cache
    others = fill(model, tmp_path / "other", OTHER)
    for (parent, tokens, _), target, source in zip(damage.chain(PROMPT), files, others):
        damage.forge(source, target, parent, tokens)
    llm = restarted(root, model)
    try:
        assert run(llm) == reference
        disk = disk_figures(llm)
        assert disk["hits"] == 0 and disk["rejected_forged"] == 1
        writer_keeps_writing(llm)
    finally:
        bounded(llm.shutdown)


def test_block_of_another_model_is_foreign(model, reference, cache, tmp_path):
    root, files = cache
    theirs = fill(str(fixture_model("tiny-llama-tied").hf_dir), tmp_path / "theirs")
    files[BAD].write_bytes(theirs[BAD].read_bytes())  # same tokens, same name, other weights
    llm = restarted(root, model)
    try:
        assert run(llm) == reference
        assert disk_figures(llm)["rejected_foreign"] == 1
    finally:
        bounded(llm.shutdown)


def garbage(path: Path) -> None:
    path.write_bytes(b"this is not an SQLite database" * 100)


def cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


INDEX_DAMAGE = [garbage, cut_in_half, damage.directory, damage.fifo]


@pytest.mark.parametrize("make", INDEX_DAMAGE, ids=[make.__name__ for make in INDEX_DAMAGE])
def test_corrupt_index_is_rebuilt_from_the_block_files(model, reference, cache, make, caplog):
    root, _ = cache
    make(root / "index.sqlite")
    with caplog.at_level(logging.WARNING):
        llm = restarted(root, model)
        try:
            assert run(llm) == reference
            assert disk_figures(llm)["hits"] == FULL_BLOCKS  # rebuilt: every block found again
            writer_keeps_writing(llm)
        finally:
            bounded(llm.shutdown)
    warnings = [r for r in caplog.records if "index" in r.message and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.message for r in warnings]


def test_new_directory_is_private_and_its_files_too(model, tmp_path):
    root = tmp_path / "new" / "kv"
    fill(model, root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    entries = list(root.rglob("*"))
    assert entries and all(stat.S_IMODE(p.lstat().st_mode) & 0o077 == 0 for p in entries), \
        sorted((p.name, oct(p.lstat().st_mode)) for p in entries)


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_directory_others_can_write_is_refused_at_start(model, cache, mode):
    root, _ = cache
    root.chmod(mode)
    with pytest.raises(InvalidParameterError, match="kv_cache_dir"):
        bounded(lambda: LLM(model, dtype=torch.float32, kv_cache_dir=str(root)))
