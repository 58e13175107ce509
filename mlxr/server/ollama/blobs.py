"""Ollama's blob store: `HEAD/POST /api/blobs/:digest`, and model files made from blobs for
/api/create's `files`.

A blob lives in `<home>/blobs/sha256-<hex>` only once its bytes hashed to the digest it was
posted under; a wrong digest or an oversized body leaves nothing behind. A created model is a
hard link (a copy across file systems) of its blobs under the names the client gave."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from mlxr.errors import InvalidParameterError

log = logging.getLogger(__name__)
router = APIRouter(tags=["ollama"])
MAX_FILES = 128
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_GGUF_MAGIC = b"GGUF"


def blob_dir(request: Request) -> Path:
    return Path(request.app.state.registry.home) / "blobs"


def blob_path(folder: Path, digest: str, field: str = "digest") -> Path:
    m = _DIGEST.fullmatch(digest)
    if m is None:
        raise InvalidParameterError(field, f"{digest!r} is not a sha256 digest (sha256:<64 hex digits>)")
    return folder / f"sha256-{m.group(1)}"


@router.head("/api/blobs/{digest}")
async def has_blob(digest: str, request: Request) -> Response:
    return Response(status_code=200 if blob_path(blob_dir(request), digest).is_file() else 404)


@router.post("/api/blobs/{digest}")
async def push_blob(digest: str, request: Request) -> Response:
    """The body is the file; its size is bounded by the server's max_blob_bytes (the guard)."""
    folder = blob_dir(request)
    final = blob_path(folder, digest)
    if final.is_file():
        return Response(status_code=200)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = folder / f".upload-{uuid.uuid4().hex}"
    h, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            async for chunk in request.stream():
                h.update(chunk)
                out.write(chunk)
                size += len(chunk)
        if f"sha256-{h.hexdigest()}" != final.name:
            raise InvalidParameterError("digest", f"digest mismatch: the body hashes to sha256:{h.hexdigest()}")
        os.replace(tmp, final)
    except ClientDisconnect:  # the client's doing, not the server's: one line, no traceback
        log.warning("blob upload %s cut by its client after %d bytes; nothing kept", final.name, size)
        return Response(status_code=400)
    finally:
        tmp.unlink(missing_ok=True)
    return Response(status_code=201)


def model_from_blobs(home: Path, files: dict[str, str], field: str = "files") -> Path:
    """A GGUF file, or a checkpoint directory, made of the named blobs (`field`: the request's
    name for them, in errors)."""
    if not files or len(files) > MAX_FILES:
        raise InvalidParameterError(field, f"give between 1 and {MAX_FILES} files (name -> blob digest)")
    blobs = {name: _existing_blob(home, name, digest, field) for name, digest in files.items()}
    if len(blobs) == 1:
        ((name, blob),) = blobs.items()
        with open(blob, "rb") as f:
            if f.read(4) == _GGUF_MAGIC:
                return _link(blob, home / "models" / "blobs" / f"{blob.name}.gguf")
    key = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:32]
    folder = home / "models" / "created" / key
    for name, blob in blobs.items():
        _link(blob, folder / name)
    return folder


def _existing_blob(home: Path, name: str, digest: str, field: str = "files") -> Path:
    if not isinstance(name, str) or not _FILE_NAME.fullmatch(name) or ".." in name:
        raise InvalidParameterError(field, f"{name!r} is not a plain file name")
    path = blob_path(home / "blobs", digest, f"{field}.{name}")
    if not path.is_file():
        raise InvalidParameterError(f"{field}.{name}", f"blob {digest} not found: push it with POST /api/blobs/{digest}")
    return path


def _link(blob: Path, dest: Path) -> Path:
    if dest.is_file() and dest.stat().st_ino == blob.stat().st_ino:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
    try:
        os.link(blob, tmp)
    except OSError:
        shutil.copyfile(blob, tmp)
    os.replace(tmp, dest)
    return dest
