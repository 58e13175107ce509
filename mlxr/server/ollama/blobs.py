"""Ollama's blob store: `HEAD/POST /api/blobs/:digest`, and model files made from blobs for
/api/create's `files`.

A blob lives in `<home>/blobs/sha256-<hex>` only once its bytes hashed to the digest it was
posted under; a wrong digest or an oversized body leaves nothing behind. A created model is a
hard link (a copy across file systems) of its blobs under the names the client gave."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from mlxr.errors import InvalidParameterError
from mlxr.server.logs import log_error_response

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
    if blob_path(blob_dir(request), digest).is_file():
        return Response(status_code=200)
    log_error_response(request.url.path, 404, "no such blob")  # a HEAD answer carries no body to say so
    return Response(status_code=404)


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
        log_error_response(request.url.path, 400, f"upload cut by its client after {size} bytes; nothing kept")
        return Response(status_code=400)
    finally:
        tmp.unlink(missing_ok=True)
    return Response(status_code=201)


def model_from_blobs(home: Path, files: dict[str, str]) -> tuple[Path, Path | None]:
    """A GGUF file, or a checkpoint directory, made of the named blobs; and a GGUF model's
    projector when two GGUF blobs are given and one is llama.cpp's mmproj file (as `ollama
    create` sends a model with its projector)."""
    blobs = _named_blobs(home, files, "files")
    pair = _model_and_projector(list(blobs.values()))
    if pair is not None:
        model, projector = pair
        linked = home / "models" / "blobs"
        return _link(model, linked / f"{model.name}.gguf"), _link(projector, linked / f"{projector.name}.gguf")
    return _model_path(home, files, blobs), None


def files_from_blobs(home: Path, files: dict[str, str], field: str) -> Path:
    """A GGUF file, or a directory, made of the named blobs (an adapter's: `field` names them in errors)."""
    return _model_path(home, files, _named_blobs(home, files, field))


def _named_blobs(home: Path, files: dict[str, str], field: str) -> dict[str, Path]:
    if not files or len(files) > MAX_FILES:
        raise InvalidParameterError(field, f"give between 1 and {MAX_FILES} files (name -> blob digest)")
    return {name: _existing_blob(home, name, digest, field) for name, digest in files.items()}


def _model_and_projector(blobs: list[Path]) -> tuple[Path, Path] | None:
    if len(blobs) != 2 or not all(_is_gguf(b) for b in blobs):
        return None
    from mlxr.formats.gguf import open_gguf

    kinds = []
    for blob in blobs:
        with open_gguf(blob) as f:
            kinds.append(f.metadata.get("general.architecture") == "clip")
    if kinds.count(True) != 1:
        raise InvalidParameterError("files", "two GGUF files make a model and its mmproj projector: "
                                             f"{'both are' if all(kinds) else 'neither is'} an mmproj file")
    return (blobs[1], blobs[0]) if kinds[0] else (blobs[0], blobs[1])


def _is_gguf(blob: Path) -> bool:
    with open(blob, "rb") as f:
        return f.read(4) == _GGUF_MAGIC


def _model_path(home: Path, files: dict[str, str], blobs: dict[str, Path]) -> Path:
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
