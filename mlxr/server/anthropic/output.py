"""A reply's pieces as Anthropic content blocks (thinking, text, tool_use), whole and as the
stream's content_block_start / _delta / _stop events; the stop_reason and usage."""
from __future__ import annotations

import uuid
from typing import Any

from mlxr.chat.tools import Piece, ToolCall

_DELTA = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text")}


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


class BlockBuilder:
    """Pieces in, content blocks and (when streaming) events out."""

    def __init__(self, streaming: bool) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._streaming = streaming  # a whole reply keeps no events
        self._open: str | None = None  # the type of the last block while text may still join it
        self.calls = 0
        self._calls: dict[str, int] = {}  # call id -> its tool_use block's index

    def add(self, pieces: list[Piece]) -> None:
        for p in pieces:
            if p.kind in ("call_start", "call_args", "call") and p.call is not None:
                self._close()
                self._tool_use(p)
            elif p.text:
                self._text("thinking" if p.kind == "reasoning" else "text", p.text)

    def close(self) -> None:
        self._close()

    def _emit(self, event: dict[str, Any]) -> None:
        if self._streaming:
            self.events.append(event)

    def _start(self, block: dict[str, Any]) -> int:
        self.blocks.append(block)
        index = len(self.blocks) - 1
        self._emit({"type": "content_block_start", "index": index, "content_block": dict(block)})
        return index

    def _text(self, kind: str, text: str) -> None:
        if self._open != kind:
            self._close()
            self._start({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                        else {"type": "text", "text": ""})
            self._open = kind
        index = len(self.blocks) - 1
        delta_type, key = _DELTA[kind]
        self.blocks[index][key] += text
        self._emit({"type": "content_block_delta", "index": index, "delta": {"type": delta_type, key: text}})

    def _close(self) -> None:
        if self._open is not None:
            self._open = None
            self._emit({"type": "content_block_stop", "index": len(self.blocks) - 1})

    def _tool_use(self, p: Piece) -> None:
        """content_block_start when the call starts, an input_json_delta per fragment of its
        arguments, content_block_stop when it is whole."""
        call: ToolCall = p.call  # type: ignore[assignment]
        index = self._calls.get(call.id)
        if index is None:
            index = self._calls[call.id] = self._start({"type": "tool_use", "id": tool_use_id(), "name": call.name,
                                                        "input": {}})
            if p.kind == "call":
                self._partial_json(index, call.arguments_json)
        if p.kind == "call_args":
            self._partial_json(index, p.text)
        if p.kind == "call":
            self.blocks[index]["input"] = call.arguments
            self._emit({"type": "content_block_stop", "index": index})
            self.calls += 1

    def _partial_json(self, index: int, text: str) -> None:
        self._emit({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": text}})


def stop_reason(finish: str | None, stop: str | int | None, stop_sequences: list[str] | None,
                has_calls: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) from the engine's finish_reason and what stopped it."""
    if finish == "length":
        return "max_tokens", None
    if isinstance(stop, str) and stop in (stop_sequences or []):
        return "stop_sequence", stop
    if finish is None:
        return None, None
    return ("tool_use" if has_calls else "end_turn"), None


def usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict[str, int]:
    """Anthropic counts the prompt's cached part apart: input_tokens is the rest."""
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
