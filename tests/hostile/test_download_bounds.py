"""T8: a hub (or its CDN) that answers every GET with 200 and fewer bytes than it listed,
ignoring Range, restarted the download forever; attempts and bytes are bounded."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from fake_hub import COMMIT, FakeHub, FakeRepo

from mlxr.errors import DownloadError
from mlxr.pull import download
from mlxr.pull.download import Expected, fetch

DATA = bytes(range(256)) * 1024  # 256 KiB


def _fetch(hub: FakeHub, dest: Path) -> None:
    hub.repos["o/r"] = FakeRepo({"model.gguf": DATA})
    url = f"{hub.url}/o/r/resolve/{COMMIT}/model.gguf"
    fetch(url, dest, Expected(len(DATA), sha256=hashlib.sha256(DATA).hexdigest()), lambda *_: None, lambda: None)


def test_a_short_answer_repeated_stops_after_the_attempts(tmp_path):
    with FakeHub() as hub:
        hub.short_by = 100
        start = time.monotonic()
        with pytest.raises(DownloadError, match="no further"):
            _fetch(hub, tmp_path / "model.gguf")
        assert time.monotonic() - start < 10
        assert len(hub.downloads("model.gguf")) == download.ATTEMPTS + 1  # the first, then ATTEMPTS that added nothing
    assert not (tmp_path / "model.gguf").exists()


def test_a_restart_that_gains_a_byte_each_time_stops_at_the_byte_bound(tmp_path):
    with FakeHub() as hub:
        hub.short_by, hub.short_step = len(DATA) // 2, 1  # each answer one byte longer, from the start again
        with pytest.raises(DownloadError, match="MAX_DOWNLOAD_RESENDS"):
            _fetch(hub, tmp_path / "model.gguf")
        received = sum(s.sent for s in hub.downloads("model.gguf"))
        # the bound, and the one transfer that passed it
        assert received <= download.MAX_DOWNLOAD_RESENDS * len(DATA) + download._CHUNK + len(DATA)


def test_a_hub_that_answers_in_full_still_downloads(tmp_path):
    with FakeHub() as hub:
        _fetch(hub, tmp_path / "model.gguf")
    assert (tmp_path / "model.gguf").read_bytes() == DATA
