"""The Responses API's request: its body, and its input items as chat messages and tools."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from mlxr.errors import InvalidParameterError
from mlxr.server.images import ImageSources
from mlxr.server.openai.schemas import SEED_MAX, SEED_MIN, MaxTokens, Priority, _Body
from mlxr.server.openai.strict_schema import strict_schema, strict_tool
from mlxr.server.openai.structured import vllm_constraint
from mlxr.server.tool_history import check_arguments
from mlxr.types import StructuredOutputsParams

MAX_ITEMS = 4096


class TextFormat(_Body):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(_Body):
    format: TextFormat | None = None


class Reasoning(_Body):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class ResponsesRequest(_Body):
    model: str | None = Field(None, max_length=512)
    # A string's bound is the rendered prompt's (prompt_work.max_prompt_chars), not the items'.
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_ITEMS)]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=512)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's extra: regex, choice, grammar, json
    reasoning: Reasoning | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    priority: Priority = 0
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None


def check_stateless(body: ResponsesRequest) -> None:
    if body.previous_response_id:
        raise InvalidParameterError("previous_response_id", "is not supported (stateless)")
    if body.store:
        raise InvalidParameterError("store", "is not supported (stateless): send store=false or leave it out")
    if body.background:
        raise InvalidParameterError("background", "is not supported (stateless: there is no stored response to "
                                                  "poll later); send background=false or leave it out")
    if body.truncation == "auto":
        # Never cut a prompt silently (docs/serving.md): too long is a 400 naming both lengths.
        raise InvalidParameterError("truncation", "'auto' is not supported: an input over the context is refused, "
                                                  "never cut; send 'disabled' or leave it out")


def _text(content: Any, where: str, images: ImageSources | None = None) -> str:
    """A message's text; an input_image part becomes the model's image marker, its data URL
    kept in `images` (None: a content that takes no images)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidParameterError(where, "content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images is not None:
            if part.get("image_url") is None:
                raise InvalidParameterError(f"{where}.content[{j}]", "an input_image needs an image_url (file_id is "
                                                                     "not supported)")
            texts.append(images.add(f"{where}.content[{j}]", part.get("image_url"), part="input_image"))
            continue
        if kind not in ("input_text", "output_text", "text"):
            raise InvalidParameterError(where, f"content parts of type {kind!r} are not supported")
        if not isinstance(part.get("text"), str):
            raise InvalidParameterError(f"{where}.content[{j}].text", f"is missing or not a string: a part of type {kind!r} needs its text")
        texts.append(part["text"])
    return "".join(texts)


def _item_message(i: int, item: dict[str, Any], messages: list[dict[str, Any]], images: ImageSources | None) -> None:
    kind = item.get("type", "message")
    where = f"input[{i}]"
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise InvalidParameterError(where, f"unknown role {role!r}")
        messages.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), where, images)})
    elif kind == "function_call":
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise InvalidParameterError(f"{where}.name", "a function_call needs the function's name")
        check_arguments(item.get("arguments"), f"{where}.arguments")
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
        last = messages[-1] if messages else None
        if last and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
            last["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(output, where)})
    elif kind != "reasoning":  # our own reasoning items, sent back: the template re-renders none
        raise InvalidParameterError(where, f"input items of type {kind!r} are not supported")


def chat_messages(body: ResponsesRequest, images: ImageSources | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    for i, item in enumerate(body.input):
        _item_message(i, item, messages, images)
    if not messages:
        raise InvalidParameterError("input", "is empty")
    return messages


def chat_tools(body: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not body.tools:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise InvalidParameterError(f"tools[{i}]", "only function tools (type 'function' with a name) are supported")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise InvalidParameterError(f"tools[{i}].parameters", "must be a JSON schema object")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        tools.append(strict_tool({"type": "function", "function": fn}))
    return tools


def responses_param(error: InvalidParameterError) -> InvalidParameterError:
    """The chat code's error under the Responses API's own field path: a tool's fields sit on
    the tool itself here (`tools[0].parameters`), not under `function`."""
    param = error.param or ""
    if not (param.startswith("tools[") and ".function" in param):
        return error
    renamed = param.replace(".function", "", 1)
    return InvalidParameterError(renamed, error.message.removeprefix(f"{param}: "))


def text_constraint(body: ResponsesRequest) -> StructuredOutputsParams | None:
    """text.format's constraint, or vLLM's `structured_outputs` (one of the two)."""
    fmt = body.text.format if body.text else None
    extra = vllm_constraint(body.structured_outputs)
    if extra is not None and fmt is not None and fmt.type != "text":
        raise InvalidParameterError("structured_outputs", "give one constraint; text.format is already one")
    if fmt is None or fmt.type == "text":
        return extra
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if not isinstance(fmt.schema_, dict):
        raise InvalidParameterError("text.format.schema", "json_schema needs a JSON schema object")
    return StructuredOutputsParams(json=strict_schema(fmt.schema_) if fmt.strict else fmt.schema_)
