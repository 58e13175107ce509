"""A model's Modelfile settings (SYSTEM, TEMPLATE, PARAMETER, MESSAGE), kept with its record.

They are stored as JSON in the registry and applied by the server at request time; a request's
own values win over them. Sizes are bounded here, once, for every way in (create, copy, a file).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mlxr.errors import InvalidParameterError

MAX_TEXT_CHARS = 64 << 10  # system prompt, template
MAX_MESSAGES = 256
MAX_MESSAGE_CHARS = 64 << 10
MAX_PARAMETERS = 64
_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ModelSettings:
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)  # Ollama option name -> value
    messages: tuple[dict[str, str], ...] = ()  # {"role", "content"}
    adapter: str | None = None  # ADAPTER: a LoRA adapter's path (GGUF file or PEFT directory) the model runs with

    def to_json(self) -> str:
        body = {"system": self.system, "template": self.template, "parameters": self.parameters,
                "messages": list(self.messages), "adapter": self.adapter}
        return json.dumps({k: v for k, v in body.items() if v})

    @classmethod
    def from_json(cls, text: str | None) -> ModelSettings:
        data = json.loads(text) if text else {}
        return cls(data.get("system"), data.get("template"), dict(data.get("parameters") or {}),
                   tuple(data.get("messages") or ()), data.get("adapter"))

    def parameters_text(self) -> str:
        """Ollama's `parameters` string of /api/show: one "name value" line per value."""
        lines = []
        for name, value in self.parameters.items():
            for item in value if isinstance(value, list) else [value]:
                lines.append(f"{name} {json.dumps(item) if isinstance(item, str) else item}")
        return "\n".join(lines)


def checked_settings(system: object, template: object, parameters: object, messages: object) -> ModelSettings:
    """Settings from a client, each bounded and typed; InvalidParameterError names the field."""
    return ModelSettings(
        _text(system, "system"), _text(template, "template"), _parameters(parameters),
        _messages(messages))


def _text(value: object, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        raise InvalidParameterError(name, f"must be a string of at most {MAX_TEXT_CHARS} characters")
    return value


def _parameters(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_PARAMETERS:
        raise InvalidParameterError("parameters", f"must be an object of at most {MAX_PARAMETERS} options")
    for name, item in value.items():
        items = item if isinstance(item, list) else [item]
        if len(items) > MAX_PARAMETERS or not all(_scalar(i) for i in items):
            raise InvalidParameterError(f"parameters.{name}", "must be a number, string, boolean or list of strings")
    return dict(value)


def _scalar(item: object) -> bool:
    return isinstance(item, (int, float, bool)) or (isinstance(item, str) and len(item) <= MAX_TEXT_CHARS)


def _messages(value: object) -> tuple[dict[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_MESSAGES:
        raise InvalidParameterError("messages", f"must be a list of at most {MAX_MESSAGES} messages")
    out = []
    for i, m in enumerate(value):
        role, content = (m.get("role"), m.get("content")) if isinstance(m, dict) else (None, None)
        if role not in _ROLES or not isinstance(content, str) or len(content) > MAX_MESSAGE_CHARS:
            raise InvalidParameterError(
                f"messages.{i}", f"needs a role ({', '.join(_ROLES)}) and a content string "
                f"of at most {MAX_MESSAGE_CHARS} characters")
        out.append({"role": role, "content": content})
    return tuple(out)
