"""The tool calls a chat history carries, checked before a template renders them: a call that
is not an object, a `function` that is not one, a missing name, or arguments that are neither
an object nor a string holding one failed deep in rendering (a 500) or rendered as nonsense."""
from __future__ import annotations

import json
from typing import Any

from mlxr.errors import InvalidParameterError


def check_tool_calls(calls: Any, where: str) -> None:
    """where: the message's field ("messages.3"); a 400 names the part that is wrong."""
    if calls is None:
        return
    if not isinstance(calls, list):
        raise InvalidParameterError(f"{where}.tool_calls", "must be a list of tool calls")
    for j, call in enumerate(calls):
        field = f"{where}.tool_calls.{j}"
        if not isinstance(call, dict):
            raise InvalidParameterError(field, "a tool call must be an object with a `function`")
        function = call.get("function")
        if not isinstance(function, dict):
            raise InvalidParameterError(f"{field}.function", "must be an object with a `name` and `arguments`")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"{field}.function.name", "must be a non-empty string")
        check_arguments(function.get("arguments"), f"{field}.function.arguments")


def check_arguments(arguments: Any, field: str) -> None:
    """A call's arguments: absent, an object, or a string holding one (OpenAI sends text)."""
    if arguments is None or isinstance(arguments, dict):
        return
    if not isinstance(arguments, str):
        raise InvalidParameterError(field, f"must be a JSON object or its text, got {type(arguments).__name__}")
    if not arguments.strip():
        return  # no arguments
    try:
        value = json.loads(arguments)
    except ValueError as e:
        raise InvalidParameterError(field, f"is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidParameterError(field, "must hold a JSON object")
