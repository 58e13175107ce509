"""The model registry: names -> model files on disk, with facts read once at import.

It records paths and never copies model files; everything it writes lives in `home`
(registry.db and SQLite's -wal/-shm files beside it).
"""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from mlxr.bundled_models import BUNDLED, GEMMA3_270M
from mlxr.bundled_models import gemma3_270m_path as bundled_model_path
from mlxr.errors import ModelFormatError, ModelNotFoundError
from mlxr.registry import db
from mlxr.registry.facts import ModelFacts, Progress, digest_files, fingerprint, inspect_model, with_projector_facts
from mlxr.registry.names import default_name, name_problem, parse_name
from mlxr.registry.record import ModelRecord, format_parameter_count, now_rfc3339, rfc3339
from mlxr.registry.settings import ModelSettings

Check = Callable[[ModelFacts], None]  # raises when the model would not load

BUNDLED_NAME = GEMMA3_270M
log = logging.getLogger(__name__)
_TOUCH_EVERY = timedelta(seconds=1)
_COLUMNS = (
    "name", "path", "format", "architecture", "family", "parameter_count", "quantization",
    "context_length", "size_bytes", "digest", "content_bytes", "content_mtime_ns",
    "created_at", "modified_at", "last_used_at", "settings", "projector",
)
# A re-import keeps when the name was created and last used.
_KEEP_ON_REPLACE = ("name", "created_at", "last_used_at")
_UPSERT = (
    f"INSERT INTO models ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in _COLUMNS)}) ON CONFLICT(name) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS if c not in _KEEP_ON_REPLACE)
)


class Registry:
    """Registered models of one data directory (MLXR_HOME), kept in `home/registry.db`.
    Safe to use from several threads and processes at once."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home).expanduser().absolute()
        try:
            self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise db.RegistryError(f"cannot create the data directory {self.home}: {e}") from None
        self._local = threading.local()
        with self._db() as conn:
            db.migrate(conn)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        # One connection per thread and process, kept between calls: the server resolves a
        # name per request, and opening SQLite (and its PRAGMAs) each time cost more than the
        # query. Never shared across threads; dropped after an error or a fork.
        conn = self._connection()
        try:
            yield conn
        except sqlite3.Error as e:
            self._drop_connection()
            raise db.RegistryError(f"model registry error ({self.home / db.DB_FILE}): {e}") from None
        except BaseException:
            self._drop_connection()  # it may be inside a transaction that nobody ends
            raise

    def _connection(self) -> sqlite3.Connection:
        held = getattr(self._local, "held", None)
        if held is not None and held[0] == os.getpid():
            return held[1]
        conn = db.connect(self.home)
        self._local.held = (os.getpid(), conn)
        return conn

    def _drop_connection(self) -> None:
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None and held[0] == os.getpid():
            held[1].close()

    def resolve(self, name: str) -> ModelRecord:
        """The record of `name` ("name" means "name:latest"). Raises ModelNotFoundError."""
        key = _lookup_key(name)
        with self._db() as conn:
            row = conn.execute("SELECT * FROM models WHERE name = ?", (key,)).fetchone()
        if row is None:
            raise ModelNotFoundError(f"model {name!r} not found")
        return _record(row)

    def list(self) -> list[ModelRecord]:
        """Every registered model, most recently modified first."""
        with self._db() as conn:
            rows = conn.execute("SELECT * FROM models ORDER BY modified_at DESC, name").fetchall()
        return [_record(r) for r in rows]

    def import_model(
        self, path: Path, name: str | None = None, progress: Progress | None = None,
        settings: ModelSettings | None = None, check: Check | None = None, projector: Path | None = None,
    ) -> ModelRecord:
        """Validate and register a .gguf file or a Hugging Face directory under `name`
        (default: from the file or directory name), replacing an existing entry of that name.
        `progress(done, total)` follows the hashing; `check(facts)` may refuse the model (the
        loader's tokenizer check: the registry does not import the loader). `projector`: an
        mmproj file for a GGUF model, checked against it and covered by the digest. Nothing is
        registered on any error."""
        canonical = parse_name(name) if name is not None else None
        facts = inspect_model(path)
        if projector is not None:
            facts = with_projector_facts(facts, projector)
        if check is not None:
            check(facts)
        before = fingerprint(facts.content)
        digest = digest_files(facts.content, progress)
        if fingerprint(facts.content) != before:
            raise ModelFormatError(f"{facts.path} changed while it was being imported")
        canonical = canonical or default_name(_stem(facts))
        now = now_rfc3339()
        values = {**_fact_values(facts), "name": canonical, "digest": digest,
                  "content_bytes": before.size, "content_mtime_ns": before.mtime_ns,
                  "created_at": now, "modified_at": now, "last_used_at": None,
                  "settings": (settings or ModelSettings()).to_json(),
                  "projector": str(facts.content[1]) if projector is not None else None}
        with self._db() as conn, db.transaction(conn):
            conn.execute(_UPSERT, values)
            row = conn.execute("SELECT * FROM models WHERE name = ?", (canonical,)).fetchone()
        return _record(row)

    def copy(self, src: str, dst: str, settings: ModelSettings | None = None) -> ModelRecord:
        """Register `dst` as another name for `src`'s model; an existing `dst` is replaced.
        `settings` replace the source's Modelfile settings where given."""
        src_key = _lookup_key(src)
        dst_key = parse_name(dst, "destination")
        with self._db() as conn, db.transaction(conn):
            row = conn.execute("SELECT * FROM models WHERE name = ?", (src_key,)).fetchone()
            if row is None:
                raise ModelNotFoundError(f"model {src!r} not found")
            if dst_key != src_key:
                now = now_rfc3339()
                values = {**dict(row), "name": dst_key, "created_at": now, "modified_at": now,
                          "last_used_at": None}
                conn.execute("DELETE FROM models WHERE name = ?", (dst_key,))
                conn.execute(_UPSERT, values)
            if settings is not None:
                conn.execute("UPDATE models SET settings = ? WHERE name = ?", (settings.to_json(), dst_key))
            row = conn.execute("SELECT * FROM models WHERE name = ?", (dst_key,)).fetchone()
        return _record(row)

    def remove(self, name: str) -> None:
        """Unregister `name` (its files stay where they are). Raises ModelNotFoundError."""
        key = _lookup_key(name)
        with self._db() as conn, db.transaction(conn):
            deleted = conn.execute("DELETE FROM models WHERE name = ?", (key,)).rowcount
        if deleted == 0:
            raise ModelNotFoundError(f"model {name!r} not found")

    def touch(self, name: str) -> None:
        """Record that `name` was just used. Unknown names are ignored: a model removed while
        a request ran must not fail that request."""
        if name_problem(name) is not None:
            return
        key = parse_name(name)
        now = datetime.now(timezone.utc)
        # At most one write a second per model: the server calls this for every request.
        with self._db() as conn:
            conn.execute(
                "UPDATE models SET last_used_at = ? WHERE name = ? "
                "AND (last_used_at IS NULL OR last_used_at < ?)",
                (rfc3339(now), key, rfc3339(now - _TOUCH_EVERY)),
            )

    def ensure_bundled(
        self, locate: Callable[[], Path] = bundled_model_path, name: str = BUNDLED_NAME
    ) -> ModelRecord:
        """Register a bundled model (default "gemma3-270m:latest") unless it already is. Cheap
        when it is: the file's size and mtime are compared, its bytes are not rehashed."""
        with self._db() as conn:
            row = conn.execute("SELECT * FROM models WHERE name = ?", (name,)).fetchone()
        if row is not None and _unchanged(row):
            return _record(row)
        return self.import_model(locate(), name)

    def ensure_all_bundled(self) -> list[ModelRecord]:
        """Register every bundled model whose package is installed (see mlxr.bundled_models)."""
        records = []
        for name, locate in BUNDLED.items():
            try:
                records.append(self.ensure_bundled(locate, name))
            except ModelNotFoundError as e:
                log.warning("%s", e)
        return records


def _unchanged(row: sqlite3.Row) -> bool:
    if row["format"] != "gguf":
        return False
    try:
        now = fingerprint([Path(row["path"])])
    except OSError:
        return False
    return (now.size, now.mtime_ns) == (row["content_bytes"], row["content_mtime_ns"])


def _lookup_key(name: str) -> str:
    """The canonical form of a name to look up; an invalid name is simply not registered."""
    if name_problem(name) is not None:
        raise ModelNotFoundError(f"model {name!r} not found (not a valid model name)")
    return parse_name(name)


def _stem(facts: ModelFacts) -> str:
    return facts.path.stem if facts.format == "gguf" else facts.path.name


def _fact_values(facts: ModelFacts) -> dict[str, Any]:
    return {
        "path": str(facts.path), "format": facts.format, "architecture": facts.architecture,
        "family": facts.family, "parameter_count": facts.parameter_count,
        "quantization": facts.quantization, "context_length": facts.context_length,
        "size_bytes": facts.size_bytes,
    }


def _record(row: sqlite3.Row) -> ModelRecord:
    return ModelRecord(
        name=row["name"], path=Path(row["path"]), format=row["format"],
        architecture=row["architecture"], family=row["family"],
        parameter_count=row["parameter_count"],
        parameter_size=format_parameter_count(row["parameter_count"]),
        quantization=row["quantization"], context_length=row["context_length"],
        size_bytes=row["size_bytes"], digest=row["digest"], created_at=row["created_at"],
        modified_at=row["modified_at"], last_used_at=row["last_used_at"],
        settings=ModelSettings.from_json(row["settings"]),
        projector=Path(row["projector"]) if row["projector"] else None,
    )
