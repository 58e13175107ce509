"""What a pull reports while it runs: Ollama's progress objects, as a typed record."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PullEvent:
    status: str  # "pulling manifest", "pulling <digest>", "verifying sha256 digest", ...
    digest: str | None = None  # "sha256:<hex>" of the file being transferred
    total: int | None = None
    completed: int | None = None

    def ollama(self) -> dict[str, Any]:
        """The object of Ollama's /api/pull stream."""
        body: dict[str, Any] = {"status": self.status}
        if self.digest is not None:
            body["digest"] = self.digest
        if self.total is not None:
            body |= {"total": self.total, "completed": self.completed or 0}
        return body


Report = Callable[[PullEvent], None]


def ignore(event: PullEvent) -> None:
    pass
