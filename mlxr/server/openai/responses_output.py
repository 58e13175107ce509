"""The Responses API's output: items (reasoning, message, function_call) built from a reply's
pieces, the response object, and the stream's events in the order the official client's
accumulator expects (created, in_progress, per item: added, deltas, done; completed)."""
from __future__ import annotations

import uuid
from typing import Any

from mlxr.chat.tools import Piece


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputBuilder:
    """Pieces in, output items and (when streaming) events out."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the reasoning or message item being written
        self._calls: dict[str, int] = {}  # call id -> its function_call item's index

    def add(self, pieces: list[Piece]) -> None:
        for p in pieces:
            if p.kind in ("call_start", "call_args", "call") and p.call is not None:
                self._close()
                self._function_call(p)
            elif p.text:
                self._text(p.kind, p.text)

    def close(self, status: str = "completed") -> None:
        """status: "incomplete" when max_output_tokens cut the reply (the item it cut is too)."""
        self._close(status)

    def _emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, **fields})

    def _start(self, item: dict[str, Any]) -> int:
        self.items.append(item)
        index = len(self.items) - 1
        self._emit("response.output_item.added", output_index=index, item=_copy(item))
        return index

    def _text(self, kind: str, text: str) -> None:
        item_type = "reasoning" if kind == "reasoning" else "message"
        if self._open is None or self._open["type"] != item_type:
            self._close()
            if item_type == "message":
                item = {"type": "message", "id": _id("msg"), "status": "in_progress", "role": "assistant", "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            else:
                item = {"type": "reasoning", "id": _id("rs"), "summary": [], "content": [], "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            index = self._start(item)
            item["content"].append(part)
            self._emit("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                       part=dict(part))
            self._open = item
        item, index = self._open, len(self.items) - 1
        item["content"][0]["text"] += text
        delta = "response.output_text.delta" if item_type == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if item_type == "message" else {}
        self._emit(delta, item_id=item["id"], output_index=index, content_index=0, delta=text, **extra)

    def _close(self, status: str = "completed") -> None:
        item, self._open = self._open, None
        if item is None:
            return
        index, part = len(self.items) - 1, item["content"][0]
        if item["type"] == "message":
            self._emit("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=part["text"], logprobs=[])
        else:
            self._emit("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=part["text"])
        self._emit("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                   part=dict(part))
        item["status"] = status
        self._emit("response.output_item.done", output_index=index, item=_copy(item))

    def _function_call(self, p: Piece) -> None:
        """added when the call starts, an arguments delta per fragment, done when it is whole."""
        call = p.call
        index = self._calls.get(call.id)
        if index is None:
            item = {"type": "function_call", "id": _id("fc"), "call_id": call.id, "name": call.name,
                    "arguments": "", "status": "in_progress"}
            index = self._calls[call.id] = self._start(item)
            if p.kind == "call":
                self._arguments(index, call.arguments_json)
        if p.kind == "call_args":
            self._arguments(index, p.text)
        if p.kind != "call":
            return
        item = self.items[index]
        self._emit("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                   name=call.name, arguments=item["arguments"])
        item["status"] = "completed" if call.cut is None else "incomplete"  # cut by max_output_tokens
        self._emit("response.output_item.done", output_index=index, item=_copy(item))

    def _arguments(self, index: int, text: str) -> None:
        item = self.items[index]
        item["arguments"] += text
        self._emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=text)


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {k: ([dict(c) for c in v] if isinstance(v, list) else v) for k, v in item.items()}


def response_object(rid: str, created: int, model: str, body: Any, output: list[dict[str, Any]],
                    status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    fmt = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format else {"type": "text"}
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions, "tools": body.tools or [], "tool_choice": body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls is not False, "temperature": body.temperature,
        "top_p": body.top_p, "max_output_tokens": body.max_output_tokens, "previous_response_id": None,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "text": {"format": fmt}, "truncation": "disabled", "store": False, "metadata": body.metadata or {},
        "usage": usage,
    }


def usage(input_tokens: int, output_tokens: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}
