"""tests/unit is pure Python: a session that ran only these tests fails if anything imported
torch (`make test-unit` runs them in seconds for it). The first import's stack is kept to name
the culprit."""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent


class _TorchImportWatch:
    """A meta-path finder that finds nothing: it only records who imported torch first."""

    first: str | None = None

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and self.first is None:
            self.first = "".join(traceback.format_stack(limit=15)[:-1])
        return None


_WATCH = _TorchImportWatch()
if "torch" not in sys.modules:
    sys.meta_path.insert(0, _WATCH)


def _only_unit_tests(session: pytest.Session) -> bool:
    return bool(session.items) and all(UNIT in Path(item.path).resolve().parents for item in session.items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "torch" not in sys.modules or not _only_unit_tests(session):
        return
    where = _WATCH.first or "before tests/unit/conftest.py was loaded (a plugin or tests/conftest.py)"
    session.config.get_terminal_writer().line(f"tests/unit imported torch; first import:\n{where}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
