"""The disk tier's directory, which nothing in it is trusted to keep safe: it is created private
to the server's user (0700) and refused when another user owns it or group or others can write
it; its seal key (a file of 32 random bytes, 0600) is made once, atomically; temporaries of
writers that died are swept without following or removing anything but files."""
from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from mlxr.errors import InvalidParameterError

log = logging.getLogger(__name__)

KEY_NAME = "seal.key"
KEY_BYTES = 32


def private_directory(path: Path) -> None:
    """path as a directory of this user's that no one else can write: created 0700 if absent;
    raises InvalidParameterError (naming kv_cache_dir) otherwise."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as e:
        raise InvalidParameterError("kv_cache_dir", f"cannot use {path} as the KV cache directory: {e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidParameterError("kv_cache_dir", f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise InvalidParameterError("kv_cache_dir", f"{path} belongs to uid {st.st_uid}, not this server's "
                                    f"({os.geteuid()}): another user could forge its KV blocks")
    if st.st_mode & 0o022:
        raise InvalidParameterError("kv_cache_dir", f"{path} is writable by group or others "
                                    f"(mode {stat.S_IMODE(st.st_mode):o}): they could forge its KV blocks; "
                                    f"chmod 700 it")


def layout_directory(root: Path, name: str) -> Path:
    """root/name, a real directory (not a symlink), created 0700."""
    path = root / name
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise InvalidParameterError("kv_cache_dir", f"cannot use {path} for KV blocks: {e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidParameterError("kv_cache_dir", f"{path} is not a directory (a symlink or file stands there)")
    return path


def seal_key(root: Path) -> bytes:
    """The directory's seal key, made now if it has none (or an unusable one: the blocks sealed
    under a lost key are then refused as forged, and recomputed)."""
    path = root / KEY_NAME
    key = _read_key(path)
    if key is not None:
        return key
    tmp = root / f"{KEY_NAME}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(KEY_BYTES))
        f.flush()
        os.fsync(f.fileno())
    try:
        if os.path.lexists(path):
            log.warning("KV disk tier: %s is unusable; a new key is made (blocks sealed under the old "
                        "one are recomputed)", path)
            _move_aside(path)
        os.link(tmp, path)  # fails if another server made one meanwhile: then that one is used
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    key = _read_key(path)
    if key is None:
        raise InvalidParameterError("kv_cache_dir", f"cannot make a usable seal key at {path}")
    return key


def _read_key(path: Path) -> bytes | None:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != KEY_BYTES or st.st_mode & 0o077:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            key = f.read(KEY_BYTES + 1)
    except OSError:
        return None
    return key if len(key) == KEY_BYTES else None


def _move_aside(path: Path) -> None:
    """Whatever stands at path (a file, FIFO, symlink or directory) renamed out of the way."""
    os.replace(path, path.with_name(f"{path.name}.bad-{os.getpid()}-{os.urandom(4).hex()}"))


def move_aside(path: Path) -> None:
    """path renamed out of the way if anything stands there."""
    if os.path.lexists(path):
        _move_aside(path)


def sweep_temporaries(directory: Path) -> None:
    """Remove the temporary files of writers killed mid-write (not those of a live server that
    shares the directory, nor anything that is not a file)."""
    for entry in os.scandir(directory):
        parts = entry.name.split(".")
        if len(parts) < 3 or parts[-1] != "tmp" or _alive(parts[-2]):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        except OSError as e:
            log.warning("KV disk tier: cannot remove %s (%s)", entry.path, e)


def _alive(pid: str) -> bool:
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_block_file(path: Path) -> str | None:
    """Unlink a block file the tier drops; the reason it could not (a directory stands there, an
    error), or None."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return "a directory stands there"
        os.unlink(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return str(e)
    return None
