"""Hostile entries for the KV disk tier's tests: what can stand where a block file or the index
should be (a directory, a FIFO, a symlink, a cut or forged file, a header nested too deep), each
made in place of a real file that an engine wrote."""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

from mlxr.engine.sched.block_manager import block_hash

MAGIC_LEN = 8  # every version's magic is 8 bytes, then the header's length (4 bytes, little-endian)


def read_header(path: Path) -> tuple[dict, bytes]:
    """A block file's JSON header and its payload."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<I", data, MAGIC_LEN)
    return json.loads(data[MAGIC_LEN + 4 : MAGIC_LEN + 4 + n]), data[MAGIC_LEN + 4 + n :]


def write_with_header(path: Path, magic: bytes, header: bytes, payload: bytes) -> None:
    path.write_bytes(magic + struct.pack("<I", len(header)) + header + payload)


def chain(tokens: list[int], block_size: int = 16) -> list[tuple[bytes | None, tuple[int, ...], bytes]]:
    """(parent hash, tokens, hash) of each full block of a prompt, as the block manager hashes them."""
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        h = block_hash(parent, block)
        out.append((parent, block, h))
        parent = h
    return out


def forge(source: Path, target: Path, parent: bytes | None, tokens: tuple[int, ...]) -> None:
    """target's file made from source's (its payload and CRC): the header names target's block,
    and where the format holds the block's tokens and parent, they are target's too."""
    header, payload = read_header(source)
    header["hash"] = target.stem
    if "tokens" in header:
        header["tokens"], header["parent"] = list(tokens), (parent or b"").hex()
    magic = source.read_bytes()[:MAGIC_LEN]
    write_with_header(target, magic, json.dumps(header).encode(), payload)


def deep_header(path: Path, depth: int = 2000) -> None:
    """The block's header turned into arrays nested `depth` deep (json.loads recurses on it)."""
    magic = path.read_bytes()[:MAGIC_LEN]
    write_with_header(path, magic, b"[" * depth + b"]" * depth, b"")


def directory(path: Path) -> None:
    if not path.is_dir():
        path.unlink()
        path.mkdir()
    (path / "inside").write_bytes(b"x")


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def symlink_outside(path: Path) -> None:
    path.unlink()
    path.symlink_to("/etc/hostname" if Path("/etc/hostname").exists() else "/etc/passwd")


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def missing(path: Path) -> None:
    path.unlink()


def old_version(path: Path) -> None:
    """The file as the first format wrote it (magic MLXRKV01, no tokens in its header)."""
    header, payload = read_header(path)
    for key in ("tokens", "parent", "seal"):
        header.pop(key, None)
    write_with_header(path, b"MLXRKV01", json.dumps(header).encode(), payload)


def copy_cache(template: Path, to: Path) -> Path:
    shutil.copytree(template, to, symlinks=True)
    return to
