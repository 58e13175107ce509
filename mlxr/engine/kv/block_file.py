"""One KV block on disk: what its file holds and how it is written and read back.

A file is MAGIC, a 4-byte header length, a JSON header and the raw tensor bytes: nothing in it
is executed or unpickled. The header is one flat object (model digest and cache layout, the
block's hash, the parent hash and the token ids it was computed from, payload length, CRC-32 and
a seal): header_limit() bounds its length before it is read, and nothing nested deeper than its
list of token ids is parsed. A block's identity is checked from what it holds: its parent and
tokens must hash to the name it is looked up by (the block manager's chained hash), and the seal,
an HMAC under the directory's key (kv_disk_dir.py) over every other field, CRC-32 included, binds
the payload to them, so a file copied from another block and renamed is refused.

A write goes to a temporary name (the writer's pid in it, created exclusively, mode 0600), is
fsynced and renamed, so a process killed mid-write leaves the whole file or none. A read accepts
a regular file only (no symlink, FIFO or device is opened in a way that can block or follow),
checks the header and the file's size, reads the payload straight into the caller's buffer and
checks its CRC-32 there. Every refusal is a BlockRejected naming its reason."""
from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import json
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# zlib-ng's CRC-32 gives zlib's values with SIMD: the H100 host's zlib 1.3 checked 1.9 GB/s, 52 ms
# of a 4,000-token TinyLlama prefix; zlib-ng runs 37 GB/s on an EPYC core (releasing the GIL too).
from zlib_ng.zlib_ng import crc32

from mlxr.engine.sched.block_manager import block_hash

MAGIC = b"MLXRKV02"  # 02: the header holds the block's tokens, parent and seal
OLD_MAGICS = (b"MLXRKV01",)  # earlier formats: skipped as foreign, rewritten when recomputed
HEADER_BASE = 2048  # a header's length, past its token ids
HEADER_PER_TOKEN = 24  # a token id's share of it (20 digits, a comma, a space)
MAX_NESTING = 2  # the header object, and its list of token ids
REASONS = ("missing", "symlink", "not_regular", "unreadable", "truncated", "corrupt", "foreign", "forged")


class BlockRejected(ValueError):
    """A block file that must not be used; reason is one of REASONS (a metric's label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Layout:
    """What a block's bytes mean: a block is only reused by the same model laid out the same way."""

    model_digest: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    device_type: str  # KV computed on another device differs in its last bits

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class BlockIdentity:
    """What a block was computed from: block_hash(parent, tokens) == hash."""

    hash: bytes
    parent: bytes | None
    tokens: tuple[int, ...]


def header_limit(layout: Layout) -> int:
    """The longest header a block of this layout can have."""
    return HEADER_BASE + HEADER_PER_TOKEN * layout.block_size


@functools.cache
def _layout_fields(layout: Layout) -> dict:
    return asdict(layout)  # asdict is slow enough to count once per block read (a prefix reads hundreds)


def _seal(key: bytes, layout: Layout, block: BlockIdentity, size: int, crc: int) -> str:
    """HMAC-SHA256 under the directory's key of the layout and everything the header says of the block."""
    message = b"".join((_layout_key(layout), block.hash, block.parent or bytes(32),
                        struct.pack(f"<QI{len(block.tokens)}q", size, crc, *block.tokens)))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@functools.cache
def _layout_key(layout: Layout) -> bytes:
    return layout.key().encode()


def private_open(path: Path, mode: str):
    """A new file at path for writing, mode 0600, never through a symlink or onto what is there."""
    assert mode == "wb"
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb")


def write_block(path: Path, layout: Layout, block: BlockIdentity, payload: memoryview, key: bytes,
                opener: Callable = private_open) -> None:
    """The block's file at path, whole or not at all; raises OSError (a full disk, say)."""
    crc = crc32(payload)
    header = json.dumps({**_layout_fields(layout), "hash": block.hash.hex(), "parent": (block.parent or b"").hex(),
                         "tokens": list(block.tokens), "bytes": len(payload), "crc32": crc,
                         "seal": _seal(key, layout, block, len(payload), crc)}).encode()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    _remove_stale(tmp)
    try:
        with opener(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        _remove_stale(tmp)
        raise


def _remove_stale(tmp: Path) -> None:
    """This process's own temporary name, left by a write that failed (a directory is left be:
    the exclusive create then fails, as a write error)."""
    try:
        if not stat.S_ISDIR(os.lstat(tmp).st_mode):
            tmp.unlink()
    except FileNotFoundError:
        pass


def open_regular(path: Path) -> int:
    """A descriptor for reading path, only if it is a regular file: a symlink is not followed,
    and a FIFO or device is not opened at all (lstat first; O_NONBLOCK in case one is swapped in)."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        raise BlockRejected("missing", "no such file") from None
    except OSError as e:
        raise BlockRejected("unreadable", str(e)) from None
    if stat.S_ISLNK(before.st_mode):
        raise BlockRejected("symlink", "a symlink")
    if not stat.S_ISREG(before.st_mode):
        raise BlockRejected("not_regular", "not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        reason = {errno.ELOOP: "symlink", errno.ENOENT: "missing"}.get(e.errno, "unreadable")
        raise BlockRejected(reason, str(e)) from None
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise BlockRejected("not_regular", "replaced while being opened")
    return fd


def read_block_into(path: Path, layout: Layout, h: bytes, into: memoryview, key: bytes) -> None:
    """Verify the file's header and size, read its payload straight into `into` (no copy of it
    in between), then check its CRC-32 there; raises BlockRejected."""
    size = len(into)
    fd = open_regular(path)
    try:
        with open(fd, "rb", buffering=0) as f:
            file_size = os.fstat(f.fileno()).st_size
            start, crc = check_header(f.read(len(MAGIC) + 4 + header_limit(layout)), layout, h, size, key)
            if file_size != start + size:
                raise BlockRejected("truncated", f"file of {file_size} bytes, expected {start + size}")
            f.seek(start)
            n = 0
            while n < size and (got := f.readinto(into[n:])):
                n += got
    except OSError as e:
        raise BlockRejected("unreadable", str(e)) from None
    if n != size:
        raise BlockRejected("truncated", f"payload of {n} bytes, expected {size}")
    if crc32(into) != crc:
        raise BlockRejected("corrupt", "checksum mismatch")


def check_header(head: bytes, layout: Layout, h: bytes, size: int, key: bytes) -> tuple[int, int]:
    """Where the payload starts and the CRC-32 the header gives it, once the header is a
    well-formed, sealed one of this block (its tokens hash to h), model and layout."""
    magic = head[: len(MAGIC)]
    if len(head) < len(MAGIC) + 4 or (magic != MAGIC and magic not in OLD_MAGICS):
        raise BlockRejected("truncated" if len(head) < len(MAGIC) + 4 else "corrupt", "not a KV block file")
    if magic != MAGIC:
        raise BlockRejected("foreign", f"an earlier format ({magic.decode(errors='replace')})")
    (n,) = struct.unpack_from("<I", head, len(MAGIC))
    start = len(MAGIC) + 4 + n
    if n > header_limit(layout):
        raise BlockRejected("corrupt", f"header of {n} bytes, more than {header_limit(layout)}")
    if len(head) < start:
        raise BlockRejected("truncated", "truncated header")
    header = parse_header(head[len(MAGIC) + 4 : start])
    wrong = sorted(k for k, v in _layout_fields(layout).items() if header.get(k) != v)
    if header.get("bytes") != size:
        wrong.append("bytes")
    if wrong:
        raise BlockRejected("foreign", f"written for another model or layout ({', '.join(wrong)} differ)")
    block = _identity(header)
    if block.hash != h or block_hash(block.parent, block.tokens) != h:
        raise BlockRejected("forged", "its tokens and parent do not hash to its name")
    if not hmac.compare_digest(_seal(key, layout, block, size, header["crc32"]), header["seal"]):
        raise BlockRejected("forged", "its seal does not match (forged, or written under another key)")
    return start, header["crc32"]


def parse_header(raw: bytes) -> dict:
    """The header's JSON object, refused before parsing when nested deeper than MAX_NESTING."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise BlockRejected("corrupt", "header is not UTF-8") from None
    if nesting(text) > MAX_NESTING:
        raise BlockRejected("corrupt", f"header nests more than {MAX_NESTING} arrays or objects")
    try:
        header = json.loads(text)
    except ValueError as e:
        raise BlockRejected("corrupt", f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise BlockRejected("corrupt", "header is not an object")
    return header


def nesting(text: str) -> int:
    """A bound on how deep JSON text nests: its count of opening brackets (at C speed, and exact
    for this format's headers, whose strings hold none)."""
    return text.count("[") + text.count("{")


def _identity(header: dict) -> BlockIdentity:
    h, parent, tokens = header.get("hash"), header.get("parent"), header.get("tokens")
    ok = (isinstance(h, str) and isinstance(parent, str) and isinstance(tokens, list)
          and all(type(t) is int and 0 <= t < 1 << 63 for t in tokens)
          and type(crc := header.get("crc32")) is int and 0 <= crc < 1 << 32
          and isinstance(seal := header.get("seal"), str) and seal.isascii())
    try:
        if ok:
            return BlockIdentity(bytes.fromhex(h), bytes.fromhex(parent) or None, tuple(tokens))
    except ValueError:
        pass
    raise BlockRejected("corrupt", "header fields of the wrong type")
