"""Reasoning ("thinking") text: which markers a family's template uses, and a streaming splitter
that sends what is between them as reasoning and the rest on as the reply.

A template that opens the block itself (the prompt ends with `<think>`, as DeepSeek-R1's and
Qwen3-Thinking's do) makes the reply start inside it; otherwise the block counts only where
the reply opens with it."""
from __future__ import annotations

from dataclasses import dataclass

from mlxr.chat.tools.json_stream import held_suffix
from mlxr.chat.tools.splitter import Piece


@dataclass(frozen=True)
class ThinkMarkers:
    start: str
    end: str


# Qwen3, QwQ, DeepSeek-R1, SmolLM3, Granite; Magistral; Command R7B.
_KNOWN = (ThinkMarkers("<think>", "</think>"), ThinkMarkers("[THINK]", "[/THINK]"),
          ThinkMarkers("<|START_THINKING|>", "<|END_THINKING|>"))


def markers_for_template(source: str | None) -> ThinkMarkers | None:
    """The markers a template knows of (None: the family does not think in text)."""
    if not source:
        return None
    return next((m for m in _KNOWN if m.end in source), None)


def template_toggles_thinking(source: str | None) -> bool:
    return bool(source) and "enable_thinking" in source  # type: ignore[operator]


class ReasoningSplitter:
    def __init__(self, markers: ThinkMarkers, prompt_text: str) -> None:
        self.m = markers
        self._inside = prompt_text.rstrip().endswith(markers.start)
        self._at_start = not self._inside
        self._after_end = False  # strip the blank lines a template puts after the block
        self._buf = ""

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._buf:
            if self._at_start:
                head = self._buf.lstrip()
                if len(head) < len(self.m.start) and self.m.start.startswith(head):
                    break  # still maybe the opening marker
                self._at_start = False
                if head.startswith(self.m.start):
                    self._buf, self._inside = head[len(self.m.start):], True
                continue
            if self._inside:
                i = self._buf.find(self.m.end)
                if i < 0:
                    keep = held_suffix(self._buf, (self.m.end,))
                    out += _piece("reasoning", self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                out += _piece("reasoning", self._buf[:i])
                self._buf, self._inside, self._after_end = self._buf[i + len(self.m.end):], False, True
                continue
            if self._after_end:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._after_end = False
            out += _piece("content", self._buf)
            self._buf = ""
        return out

    def finish(self) -> list[Piece]:
        text, self._buf = self._buf, ""
        if self._after_end:
            text = text.lstrip()
        return _piece("reasoning" if self._inside else "content", text)


def _piece(kind: str, text: str) -> list[Piece]:
    return [Piece(kind, text)] if text else []
