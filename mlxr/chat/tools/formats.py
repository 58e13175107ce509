"""Tool-call formats: how a family's replies mark a call, how its template is recognised, and
the registry they join. A new format is one module that calls `register` (listed in
__init__.py, whose order is the order `detect` is tried in); choice.py picks the first
registered format whose `detect` accepts a template, then one inferred from the template's
own markers (inferred.py), and GENERIC (tools described in the system prompt) for a template
that renders no tools.

A format whose block is not JSON calls gives `parse` (the block's text and the tools'
parameter schemas -> calls, None when not calls) and `partial` (the text of a block not
closed yet -> the calls so far, json_stream.Partial: name, the arguments' canonical prefix)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

from mlxr.chat.tools.calls import ToolCall, calls_from_json
from mlxr.chat.tools.json_stream import Partial, partial_json_calls

Tools = dict[str, Any] | None  # a request's tools: name -> parameters schema


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
    string_arguments: bool = False  # the template joins a past call's arguments as JSON text
    opens_reply: bool = False  # a call block only opens the reply (Llama 4's list of calls)
    parse: Callable[[str, Tools], list[ToolCall] | None] | None = None  # None: JSON calls
    partial: Callable[[str, Tools], list[Partial]] | None = None  # None: JSON calls

    def parse_block(self, body: str, tools: Tools = None) -> list[ToolCall] | None:
        """The calls in the text between a start marker and the end (None: not calls)."""
        if self.parse is not None:
            return self.parse(body, tools)
        return calls_from_json(body.strip())

    def preview(self, body: str, tools: Tools = None, json_only: bool = False, final: bool = False) -> list[Partial]:
        """The calls of a block still being written (json_only: the text is JSON calls, as a
        forced call's grammar writes them, whatever the family's own format; final: the
        reply ends here, cut off)."""
        if self.partial is not None and not json_only:
            return self.partial(body, tools)
        return partial_json_calls(body, (self.args_key, "arguments", "parameters"), final)

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
