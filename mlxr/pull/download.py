"""One file over HTTP into the models directory: resumable across runs, checksum-verified.

The bytes go to `<name>.partial` beside the destination; a later run (after a crash, a kill or
a lost connection) asks for the rest with a Range request. Only a file whose sha256 (or git
blob sha1, for small files the hub keeps outside LFS) matches what the hub listed is renamed
into place; a mismatch deletes the partial file, so the next pull starts clean.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from mlxr.errors import DownloadError

Progress = Callable[[int, int], None]  # (bytes done, total)
ATTEMPTS = 5  # consecutive transfers that bring the file no further before giving up
# Bytes one download may receive in all, as a multiple of the file's size (plus a chunk): a hub
# that restarts every transfer from 0 and gains a byte each time would otherwise send size**2.
MAX_DOWNLOAD_RESENDS = 3
_CHUNK = 1 << 20
_TIMEOUT = httpx2.Timeout(30.0, read=120.0)


@dataclass(frozen=True)
class Expected:
    size: int
    sha256: str | None = None  # LFS files
    git_sha1: str | None = None  # small files: sha1 of "blob <size>\0" + content

    def __post_init__(self) -> None:
        if self.sha256 is None and self.git_sha1 is None:
            raise DownloadError("the hub listed no checksum for a file; refusing to download it unchecked")

    @property
    def label(self) -> str:
        return f"sha256:{self.sha256}" if self.sha256 else f"sha1:{self.git_sha1}"


def fetch(url: str, dest: Path, expected: Expected, progress: Progress, verifying: Callable[[], None]) -> None:
    """Download `url` to `dest` unless `dest` already holds the expected bytes."""
    if dest.is_file() and dest.stat().st_size == expected.size and _matches(dest, expected):
        progress(expected.size, expected.size)
        return
    partial = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _check_space(dest.parent, expected.size - _size(partial))
    _fill(url, partial, expected.size, progress, dest.name)
    verifying()
    if not _matches(partial, expected):
        partial.unlink(missing_ok=True)
        raise DownloadError(f"{dest.name} does not match its checksum ({expected.label}); the download was "
                            "deleted")
    os.replace(partial, dest)


@dataclass
class _Tally:
    received: int = 0  # bytes of every transfer of this download


def _fill(url: str, partial: Path, size: int, progress: Progress, name: str) -> None:
    """Transfers until `partial` holds `size` bytes. A transfer that ends short without an error
    (a server that ignores Range and sends fewer bytes than it listed) counts like one that
    fails: ATTEMPTS in a row that reach no further than before end it, and so do more bytes
    received than MAX_DOWNLOAD_RESENDS times the file."""
    tally, stalled, furthest = _Tally(), 0, _size(partial)
    while (have := _size(partial)) != size:
        problem = f"the server sent {have} of its {size} bytes and ended the transfer"
        try:
            _transfer(url, partial, have, size, progress, tally)
        except (httpx2.TransportError, DownloadError) as e:
            problem = str(e)
        now = _size(partial)
        stalled = 0 if now > furthest else stalled + 1
        furthest = max(furthest, now)
        if now != size and stalled >= ATTEMPTS:
            raise DownloadError(f"cannot download {name}: {problem} ({ATTEMPTS} transfers in a row "
                                "brought it no further)")
        if now != size and tally.received > MAX_DOWNLOAD_RESENDS * size + _CHUNK:
            raise DownloadError(f"cannot download {name}: {tally.received} bytes received for a file of {size} "
                                f"(at most MAX_DOWNLOAD_RESENDS={MAX_DOWNLOAD_RESENDS} times its size): "
                                "the server keeps restarting it")


def _transfer(url: str, partial: Path, start: int, size: int, progress: Progress, tally: _Tally) -> None:
    if start > size:
        start = _truncate(partial)
    headers = {**build_hf_headers(), "Accept-Encoding": "identity"}
    if start:
        headers["Range"] = f"bytes={start}-"
    with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=_TIMEOUT) as r:
        hf_raise_for_status(r)
        if start and r.status_code != 206:  # the server ignored the Range: start over
            start = _truncate(partial)
        done = start
        progress(done, size)
        with open(partial, "ab") as out:
            for chunk in r.iter_bytes():
                done += len(chunk)
                tally.received += len(chunk)
                if done > size:
                    _truncate(partial)
                    raise DownloadError(f"the server sent more than the {size} bytes it listed")
                out.write(chunk)
                progress(done, size)


def _matches(path: Path, expected: Expected) -> bool:
    if path.stat().st_size != expected.size:
        return False
    if expected.sha256 is not None:
        h = hashlib.sha256()
    else:
        h = hashlib.sha1()
        h.update(f"blob {expected.size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK * 4):
            h.update(chunk)
    return h.hexdigest() == (expected.sha256 or expected.git_sha1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _truncate(path: Path) -> int:
    with open(path, "wb"):
        pass
    return 0


def _check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DownloadError(f"not enough disk space in {folder}: {needed} bytes needed, {free} free")
