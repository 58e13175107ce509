"""The disk tier's SQLite index (one row per block file: its layout, hash, size and last use).
It is a cache of what the block files say: an index that is not a regular file, cannot be opened
or fails SQLite's quick check is moved aside and rebuilt from the block files on disk (their
names and sizes; each file's contents are still checked when it is read), with one warning."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import stat
from pathlib import Path

from mlxr.engine.kv.disk_dir import move_aside

log = logging.getLogger(__name__)

INDEX_NAME = "index.sqlite"
SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's own, beside the index
LAYOUT_DIR = re.compile(r"[0-9a-f]{32}")
BLOCK_FILE = re.compile(r"([0-9a-f]{64})\.kvb")


def connect(db_path: Path) -> sqlite3.Connection:
    """The index, created 0600 if new (SQLite gives its -wal and -shm files the same mode)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    db = sqlite3.connect(db_path, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS blocks (layout TEXT, hash BLOB, bytes INTEGER, "
               "last_used REAL, PRIMARY KEY (layout, hash))")
    return db


def open_index(root: Path) -> Path:
    """root's index, usable: checked, or rebuilt from the block files if it was not."""
    db_path = root / INDEX_NAME
    problem = _problem(db_path)
    if problem is None:
        _drop_bad_rows(db_path)
        return db_path
    for suffix in ("", *SIDE_FILES):
        move_aside(db_path.with_name(INDEX_NAME + suffix))
    count = rebuild(db_path, root)
    log.warning("KV disk tier: the index %s was unusable (%s); it was moved aside and rebuilt from "
                "the %d block files found", db_path, problem, count)
    return db_path


def _problem(db_path: Path) -> str | None:
    """What is wrong with the index (None: nothing, or it does not exist yet)."""
    for suffix in ("", *SIDE_FILES):
        path = db_path.with_name(INDEX_NAME + suffix)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):  # SQLite would open a FIFO and wait on it forever
            return f"{path.name} is not a regular file"
    try:
        db = connect(db_path)
        try:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
            db.execute("SELECT layout, hash, bytes, last_used FROM blocks LIMIT 1").fetchall()
        finally:
            db.close()
    except sqlite3.Error as e:
        return str(e)
    return None if verdict == "ok" else f"quick_check: {verdict}"


def _drop_bad_rows(db_path: Path) -> None:
    """Rows this code never writes (an index edited or damaged by hand) are deleted, so every row
    read later is a (32-hex layout, 32-byte hash, size, time) one."""
    db = connect(db_path)
    try:
        dropped = db.execute(
            "DELETE FROM blocks WHERE typeof(layout) != 'text' OR length(layout) != 32 OR typeof(hash) != 'blob' "
            "OR length(hash) != 32 OR typeof(bytes) != 'integer' OR bytes < 0 "
            "OR typeof(last_used) NOT IN ('real', 'integer')").rowcount
        db.commit()
    finally:
        db.close()
    if dropped:
        log.warning("KV disk tier: %d malformed rows dropped from the index %s", dropped, db_path)


def rebuild(db_path: Path, root: Path) -> int:
    """A new index of every well-named regular block file under root; how many it holds."""
    rows = list(_block_files(root))
    db = connect(db_path)
    try:
        db.executemany("INSERT OR REPLACE INTO blocks VALUES (?, ?, ?, ?)", rows)
        db.commit()
    finally:
        db.close()
    return len(rows)


def _block_files(root: Path):
    for layout in os.scandir(root):
        if not (LAYOUT_DIR.fullmatch(layout.name) and layout.is_dir(follow_symlinks=False)):
            continue
        for entry in os.scandir(layout.path):
            match = BLOCK_FILE.fullmatch(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                yield layout.name, bytes.fromhex(match[1]), st.st_size, st.st_mtime
