"""A fixture directory written once and shared by every process that asks for it."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_once(final: Path, write: Callable[[Path], None], prefix: str) -> Path:
    """`final`, filled by write(tmp) the first time: each writer fills a private directory beside
    it and renames it into place, so a writer that loses the race keeps the winner's."""
    final = Path(final)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{prefix}-", dir=final.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
