"""The registry's SQLite database: connection settings and numbered schema migrations.

WAL mode and one transaction per write keep the file consistent when a process is killed at
any moment; busy_timeout lets several processes (server, CLI) share it.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlxr.errors import MLXRError

DB_FILE = "registry.db"
BUSY_TIMEOUT_S = 30.0

# Append only: a released migration is never edited, the next one changes what it made.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE models (
            name TEXT PRIMARY KEY NOT NULL,
            path TEXT NOT NULL CHECK (substr(path, 1, 1) = '/'),
            format TEXT NOT NULL CHECK (format IN ('gguf', 'safetensors')),
            architecture TEXT NOT NULL,
            family TEXT NOT NULL,
            parameter_count INTEGER NOT NULL CHECK (parameter_count >= 0),
            quantization TEXT NOT NULL,
            context_length INTEGER NOT NULL CHECK (context_length > 0),
            size_bytes INTEGER NOT NULL CHECK (size_bytes >= 0),
            digest TEXT NOT NULL CHECK (length(digest) = 71 AND digest GLOB 'sha256:*'
                AND substr(digest, 8) NOT GLOB '*[^0-9a-f]*'),
            content_bytes INTEGER NOT NULL,
            content_mtime_ns INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            modified_at TEXT NOT NULL,
            last_used_at TEXT
        )""",
        "CREATE INDEX models_digest ON models (digest)",
    ),
    # Modelfile settings (registry/settings.py) as JSON.
    ("ALTER TABLE models ADD COLUMN settings TEXT NOT NULL DEFAULT '{}'",),
    # A GGUF model's projector: llama.cpp's mmproj file (vision tower and projector), an absolute path.
    ("ALTER TABLE models ADD COLUMN projector TEXT CHECK (projector IS NULL OR substr(projector, 1, 1) = '/')",),
)


class RegistryError(MLXRError):
    """The registry database cannot be opened or is damaged."""

    status = 500
    kind = "internal_error"


def connect(home: Path) -> sqlite3.Connection:
    """A connection in autocommit mode; callers open transactions with `transaction`."""
    try:
        conn = sqlite3.connect(home / DB_FILE, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA temp_store = MEMORY")  # no temporary files outside home
    except sqlite3.Error as e:
        raise RegistryError(f"cannot open the model registry in {home}: {e}") from None
    conn.row_factory = sqlite3.Row
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception. IMMEDIATE takes the write
    lock up front, so two writers wait on busy_timeout instead of failing to upgrade."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations this database lacks, all in one transaction; returns the version."""
    with transaction(conn):
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        current = row[0] or 0
        if current > len(MIGRATIONS):
            raise RegistryError(
                f"the model registry has schema version {current}, newer than this mlxr "
                f"understands ({len(MIGRATIONS)}); upgrade mlxr"
            )
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
    return len(MIGRATIONS)
