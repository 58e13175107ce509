"""Print one request's text as the engine produces it. Ctrl-C stops the reply between two
engine steps (never inside one), so the engine is left consistent for the next request."""
from __future__ import annotations

import signal
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamResult:
    text: str
    interrupted: bool  # Ctrl-C stopped it; the request was aborted


def print_stream(engine, request_id: str, prompt, params) -> StreamResult:
    """prompt: text or token ids. Ends the output with a newline."""
    engine.add_request(request_id, prompt, params, stream_deltas=True)
    parts: list[str] = []
    stop = _CtrlC()
    with stop:
        while engine.has_unfinished() and not stop.pressed:
            for out in engine.step():
                delta = out.outputs[0].text if out.outputs else ""
                parts.append(delta)
                sys.stdout.write(delta)
                sys.stdout.flush()
    if stop.pressed:
        engine.abort(request_id)
    print()
    return StreamResult("".join(parts), stop.pressed)


class _CtrlC:
    """Turns SIGINT into a flag for the duration of a `with` block (main thread only)."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous = None

    def __enter__(self) -> _CtrlC:
        self._previous = signal.signal(signal.SIGINT, self._press)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _press(self, signum, frame) -> None:
        self.pressed = True
