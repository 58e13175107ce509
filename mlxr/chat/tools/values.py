"""What the formats that write arguments as key/value pairs (not JSON) share: reading a value
by its parameter's schema type, and the canonical arguments text (as `json.dumps` writes
them) of the pairs written so far, for streaming."""
from __future__ import annotations

import json
from typing import Any

from mlxr.chat.tools.json_stream import json_args_prefix


def param_type(tools: dict[str, Any] | None, tool: str, key: str) -> Any:
    """The declared JSON type of a tool's parameter (None: not declared, or unknown tool)."""
    params = (tools or {}).get(tool) or {}
    prop = (params.get("properties") or {}).get(key) if isinstance(params, dict) else None
    return prop.get("type") if isinstance(prop, dict) else None


def is_string(kind: Any) -> bool:
    return kind == "string" or (isinstance(kind, list) and kind[:1] == ["string"])


def typed_value(text: str, kind: Any) -> Any:
    """A value written as text: kept as text for a string parameter, else read as JSON where it
    parses (numbers, booleans, objects, lists), else kept as text."""
    if is_string(kind):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def pairs_prefix(done: list[tuple[str, Any]], open_key: str | None = None, open_text: str | None = None,
                 closed: bool = False) -> str:
    """The canonical arguments text of the complete pairs, then of a string value still being
    written (open_text: as far as it is final), then `}` once the call is closed."""
    parts = [f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in done]
    text = "{" + ", ".join(parts)
    if closed:
        return text + "}"
    if open_key is not None and open_text is not None:
        sep = ", " if parts else ""
        text += sep + json.dumps(open_key, ensure_ascii=False) + ": " + json.dumps(open_text, ensure_ascii=False)[:-1]
    return text


def json_object_prefix(text: str) -> str:
    """The canonical prefix of a JSON object still being written (its arguments)."""
    return json_args_prefix(text)
