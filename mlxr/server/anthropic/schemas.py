"""Request bodies of the Anthropic routes. Content blocks, `system` blocks and tools stay
plain objects here: history.py checks each and names the field that is wrong (an unknown
block type included), which a union of models would bury in its member names."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from mlxr.server.openai.schemas import MAX_STOP, MaxTokens, _Body

MAX_MESSAGES = 4096
MAX_BLOCKS = 4096  # content blocks in one message or in `system`


def _block(kind: str, **fields: dict[str, Any]) -> dict[str, Any]:
    """A content block's shape for /openapi.json (history.py checks it)."""
    return {"type": "object", "required": ["type", *fields],
            "properties": {"type": {"const": kind}, **fields}}


_STRING = {"type": "string"}
TEXT_BLOCK = _block("text", text=_STRING)
_SOURCE = {"anyOf": [
    {"type": "object", "required": ["type", "media_type", "data"],
     "properties": {"type": {"const": "base64"}, "media_type": _STRING, "data": _STRING}},
    {"type": "object", "required": ["type", "url"], "properties": {"type": {"const": "url"}, "url": _STRING}}]}
_RESULT_CONTENT = {"anyOf": [_STRING, {"type": "array", "items": TEXT_BLOCK}]}
CONTENT_BLOCKS = [TEXT_BLOCK, _block("image", source=_SOURCE),
                  _block("tool_use", id=_STRING, name=_STRING, input={"type": "object"}),
                  _block("tool_result", tool_use_id=_STRING, content=_RESULT_CONTENT),
                  _block("thinking", thinking=_STRING), _block("redacted_thinking", data=_STRING)]
Blocks = Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS,
                                               json_schema_extra={"items": {"anyOf": CONTENT_BLOCKS}})]
SystemBlocks = Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS, json_schema_extra={"items": TEXT_BLOCK})]
TOOL = {"type": "object", "required": ["name", "input_schema"],
        "properties": {"name": _STRING, "description": _STRING, "input_schema": {"type": "object"}}}


class Message(_Body):
    role: Literal["user", "assistant"]
    content: str | Blocks


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, max_length=512)
    disable_parallel_tool_use: bool | None = None


class Thinking(_Body):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=1)
    display: Literal["summarized", "omitted"] | None = None  # ignored: reasoning is shown as written


class Conversation(_Body):
    """What count_tokens and messages share: everything that goes into the prompt."""

    model: str = Field(min_length=1, max_length=512)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | SystemBlocks | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=512, json_schema_extra={"items": TOOL})] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(Conversation):
    max_tokens: MaxTokens
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=(1 << 31) - 1)
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # user_id: ignored
    structured_outputs: dict[str, Any] | None = None  # vLLM's extra, as on the OpenAI routes
