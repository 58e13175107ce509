"""Conversation messages -> what a chat template is given.

Tool-aware templates get the messages as transformers passes them (a call's arguments as an
object). Templates that know nothing of tools (the built-in Gemma and ChatML ones, SmolLM2's)
get plain user/assistant/system turns: the tools described in the system prompt, an assistant
turn's calls written as `<tool_call>` lines, a tool result as a user turn in
`<tool_response>` (merged with the user turns around it, since Gemma's turns must alternate).
"""
from __future__ import annotations

import json
from typing import Any

from mlxr.chat.tools.formats import ToolFormat
from mlxr.chat.tools.generic import call_text, response_text, tools_prompt


def template_messages(messages: list[dict[str, Any]], fmt: ToolFormat,
                      tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], list | None]:
    """(messages, tools) to render with the template the format was chosen for."""
    messages = [_with_object_arguments(m) for m in messages]
    if fmt.renders_tools:
        return ([_with_text_arguments(m) for m in messages] if fmt.string_arguments else messages), tools
    plain = _merge_user_turns([_plain_turn(m) for m in messages])
    if tools:
        plain = _with_system_text(plain, tools_prompt(tools))
    return plain, None


def _function(call: dict[str, Any]) -> dict[str, Any]:
    return call.get("function", call) if isinstance(call, dict) else {}


def _with_object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        fn = dict(_function(call))
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # left as the client sent it
        fixed.append({**call, "type": "function", "function": fn})
    return {**message, "tool_calls": fixed}


def _with_text_arguments(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        fn = dict(call["function"])
        if not isinstance(fn.get("arguments"), str):
            fn["arguments"] = json.dumps(fn.get("arguments", {}), ensure_ascii=False)
        calls.append({**call, "function": fn})
    return {**message, "tool_calls": calls}


def _plain_turn(message: dict[str, Any]) -> dict[str, Any]:
    role, content = message.get("role"), message.get("content") or ""
    if role == "tool" or role == "function":
        return {"role": "user", "content": response_text(content), "_tool": True}
    if role == "assistant" and message.get("tool_calls"):
        lines = [call_text(_function(c).get("name", ""), _function(c).get("arguments", {}))
                 for c in message["tool_calls"]]
        return {"role": "assistant", "content": "\n".join([content, *lines] if content else lines)}
    if role == "developer":
        role = "system"
    return {"role": role, "content": content}


def _merge_user_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Only where a tool result is one of the two: other turns stay as the client sent them."""
    out: list[dict[str, Any]] = []
    for m in messages:
        last = out[-1] if out else None
        if (last and m["role"] == last["role"] == "user" and (m.get("_tool") or last.get("_tool"))
                and isinstance(m["content"], str) and isinstance(last["content"], str)):
            out[-1] = {"role": "user", "content": last["content"] + "\n" + m["content"], "_tool": True}
        else:
            out.append(m)
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{"role": "system", "content": f"{first['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
