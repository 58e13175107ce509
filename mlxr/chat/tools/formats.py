"""Tool-call formats: how a family's replies mark a call, how its template is recognised, and
the registry they join. A new format is one module that calls `register` (listed in
__init__.py); choice.py picks the first registered format whose `detect` accepts a template,
and GENERIC (tools described in the system prompt) for a template that renders no tools."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

from mlxr.chat.tools.calls import ToolCall, calls_from_json


@dataclass(frozen=True)
class ToolFormat:
    name: str
    starts: tuple[str, ...]  # text that opens a call block in a reply
    end: str | None  # text that closes one (None: the block runs to the end of the reply)
    detect: Callable[[str], bool]  # does this chat template render tools in this format?
    # A reply that opens with JSON may be a call: the marker is a special token the
    # detokenizer drops (Llama 3's <|python_tag|>, Mistral's [TOOL_CALLS]).
    bare_json: bool = False
    args_key: str = "arguments"  # the key the family writes a call's arguments under
    renders_tools: bool = True  # False: tools and tool turns are rendered by messages.py

    def parse_block(self, body: str) -> list[ToolCall] | None:
        """The calls in the text between a start marker and the end (None: not calls)."""
        return calls_from_json(body.strip())

    def call_schema(self, name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
        """A JSON schema for one call of `name` in this family's key names."""
        params = own_resource(name, parameters) if parameters else {"type": "object"}
        return {"type": "object", "properties": {"name": {"const": name}, self.args_key: params},
                "required": ["name", self.args_key], "additionalProperties": False}


def own_resource(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters as a JSON-schema resource of their own (an `$id`), so the `$ref`s in
    them (`#`, `#/$defs/...`: openai.pydantic_function_tool's nested models) resolve against the
    parameters, not against the call schema they are placed in. A root `$ref` moves into
    `allOf` (the same schema since draft 2019-09), because drafts up to 7 ignore its siblings,
    the `$id` among them. Parameters that carry an `$id` of their own are left as they are.
    Parameters that declare draft 4 (or 3), whose resources are named by `id`, get an `id` too."""
    if not isinstance(parameters, dict) or "$id" in parameters:
        return parameters
    uri = "urn:mlxr:tool:" + quote(name, safe="")
    scoped = {**parameters, "$id": uri}
    if _names_resources_by_id(parameters):
        scoped.setdefault("id", uri)
    if "$ref" in scoped and isinstance(scoped.get("allOf", []), list):
        scoped["allOf"] = [*scoped.get("allOf", []), {"$ref": scoped.pop("$ref")}]
    return scoped


def _names_resources_by_id(schema: dict[str, Any]) -> bool:
    """Whether the schema declares a draft (3 or 4) whose resource identifier is `id`."""
    declared = schema.get("$schema")
    return isinstance(declared, str) and ("draft-04" in declared or "draft-03" in declared)


_REGISTRY: list[ToolFormat] = []


def register(fmt: ToolFormat) -> ToolFormat:
    _REGISTRY.append(fmt)
    return fmt


def registered() -> list[ToolFormat]:
    return list(_REGISTRY)


def format_named(name: str) -> ToolFormat | None:
    return next((f for f in _REGISTRY if f.name == name), None)
