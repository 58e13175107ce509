"""An Anthropic conversation as the chat messages, tools and tool_choice the chat plan takes:
`system` as a system turn, `tool_use` blocks as an assistant turn's calls, `tool_result`
blocks as tool turns, `thinking` blocks as the turn's reasoning_content (templates that show
past reasoning render it, the others drop it). Every refusal names the block's field."""
from __future__ import annotations

from typing import Any

from mlxr.errors import InvalidParameterError
from mlxr.server.anthropic.schemas import Conversation, Message, ToolChoice
from mlxr.server.images import ImageSources
from mlxr.server.tool_history import check_arguments

_DROPPED = frozenset({"redacted_thinking"})  # opaque to this server: nothing to render


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise InvalidParameterError(f"{where}.{key}", f"is missing or not a string: a {block.get('type')!r} block needs it")
    return value


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise InvalidParameterError(where, "a content block must be an object with a `type`")
    kind = block.get("type")
    if not isinstance(kind, str):
        raise InvalidParameterError(f"{where}.type", "is missing or not a string")
    return kind


def text_of(content: Any, where: str) -> str:
    """A string, or text blocks joined (`system`, a tool_result's content)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParameterError(where, "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(content):
        kind = _block_type(block, f"{where}[{j}]")
        if kind != "text":
            raise InvalidParameterError(f"{where}[{j}].type", f"blocks of type {kind!r} are not supported here: only 'text'")
        texts.append(_string(block, "text", f"{where}[{j}]"))
    return "".join(texts)


class _Turn:
    """One Anthropic message being turned into chat messages."""

    def __init__(self, role: str, where: str, images: ImageSources | None = None) -> None:
        self.role, self.where, self.images = role, where, images
        self.texts: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.results: list[dict[str, Any]] = []
        self.reasoning: list[str] = []

    def add(self, j: int, block: Any) -> None:
        where = f"{self.where}[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            self.texts.append(_string(block, "text", where))
        elif kind == "image" and self.role == "user" and self.images is not None:
            self.texts.append(_image(block, where, self.images))
        elif kind == "tool_use" and self.role == "assistant":
            self.calls.append(_call(block, where))
        elif kind == "tool_result" and self.role == "user":
            self.results.append(_result(block, where))
        elif kind == "thinking" and self.role == "assistant":
            self.reasoning.append(_string(block, "thinking", where))
        elif kind not in _DROPPED:
            raise InvalidParameterError(f"{where}.type", f"blocks of type {kind!r} are not supported in a "
                                                         f"{self.role} message")

    def messages(self) -> list[dict[str, Any]]:
        out = list(self.results)  # Anthropic puts tool results first in their user turn
        text = "".join(self.texts)
        if self.role == "user" and (text or not out):
            out.append({"role": "user", "content": text})
        elif self.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if self.calls:
                msg["tool_calls"] = self.calls
            if self.reasoning:
                msg["reasoning_content"] = "".join(self.reasoning)
            out.append(msg)
        return out


def _call(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name = _string(block, "id", where), _string(block, "name", where)
    if not name:
        raise InvalidParameterError(f"{where}.name", "must be a non-empty string")
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise InvalidParameterError(f"{where}.input", f"must be a JSON object, got {type(arguments).__name__}")
    check_arguments(arguments, f"{where}.input")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = _string(block, "tool_use_id", where)
    content = text_of(block.get("content", ""), f"{where}.content")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise InvalidParameterError(f"{where}.is_error", "must be a boolean")
    if is_error:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _image(block: dict[str, Any], where: str, images: ImageSources) -> str:
    """An image block's source (base64, or a URL) kept in images; its marker in the text."""
    if images.vision is None:
        raise InvalidParameterError(f"{where}.type", "this model takes text only: blocks of type 'image' are not "
                                                     "supported")
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return images.add(where, source.get("data"), "base64")
    if kind == "url":
        return images.add(where, source.get("url"))
    raise InvalidParameterError(f"{where}.source", "an image needs a source of type 'base64' or 'url'")


def _message(i: int, m: Message, images: ImageSources | None) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    turn = _Turn(m.role, f"messages[{i}].content", images)
    for j, block in enumerate(m.content):
        turn.add(j, block)
    return turn.messages()


def chat_messages(body: Conversation, images: ImageSources | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.system is not None:
        system = text_of(body.system, "system")
        if system:
            out.append({"role": "system", "content": system})
    for i, m in enumerate(body.messages):
        out += _message(i, m, images)
    return out


def chat_tools(body: Conversation) -> list[dict[str, Any]] | None:
    if not body.tools:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.get("type", "custom") not in ("custom", None):
            raise InvalidParameterError(f"tools[{i}].type", f"{tool['type']!r} is not supported: only client tools "
                                                            "(a name and an input_schema)")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"tools[{i}].name", "must be a non-empty string")
        if not isinstance(schema, dict):
            raise InvalidParameterError(f"tools[{i}].input_schema", "must be a JSON schema object")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidParameterError(f"tools[{i}].description", "must be a string")
        fn = {"name": name, "parameters": schema, **({"description": description} if description else {})}
        tools.append({"type": "function", "function": fn})
    return tools


def tool_choice(choice: ToolChoice | None, has_tools: bool) -> tuple[Any, bool | None]:
    """(the chat plan's tool_choice, its `parallel`)."""
    if choice is None:
        return None, None
    if choice.type in ("any", "tool") and not has_tools:
        raise InvalidParameterError("tool_choice", f"{choice.type!r} needs tools")
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "tool":
        if not choice.name:
            raise InvalidParameterError("tool_choice.name", "a tool_choice of type 'tool' needs the tool's name")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def anthropic_param(error: InvalidParameterError) -> InvalidParameterError:
    """The chat plan's error under this API's field names: a tool's `input_schema`, not its
    `function.parameters`."""
    param = error.param or ""
    renamed = param.replace(".function.parameters", ".input_schema").replace(".function", "")
    if renamed == param:
        return error
    return InvalidParameterError(renamed, error.message.removeprefix(f"{param}: "))
