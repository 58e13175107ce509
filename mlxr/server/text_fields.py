"""Request text must be valid Unicode. JSON may escape a lone surrogate ("a\\ud800b"); Python
accepts it in a str, but the tokenizer cannot encode it. Refused at validation, so the 400
names the field instead of the tokenizer failing later with a 500."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, field_validator, model_validator


_SCALARS = {int, float, bool, type(None)}


def lone_surrogate_in(value: Any) -> bool:
    """True when a string anywhere in value (nested lists, dicts and their keys) has one.
    Iterative: a deeply nested JSON schema must not exhaust the interpreter's stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _bad_str(item):
                return True
        elif isinstance(item, (list, tuple)):
            if not set(map(type, item)) <= _SCALARS:  # token-id lists: a C-speed pass, not a loop
                stack += [v for v in item if type(v) not in _SCALARS]
        elif isinstance(item, dict):
            stack += item.keys()
            stack += [v for v in item.values() if type(v) not in _SCALARS]
    return False


def _bad_str(value: str) -> bool:
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_MESSAGE = "holds a lone surrogate (invalid Unicode); send text as UTF-8 or as surrogate pairs"


class CheckedText(BaseModel):
    """Base of request bodies: every field, and fields a model keeps as extras, checked."""

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        if lone_surrogate_in(value):
            raise ValueError(_MESSAGE)
        return value

    @model_validator(mode="after")
    def _valid_unicode_extras(self) -> Any:
        for key, value in (self.model_extra or {}).items():
            if lone_surrogate_in(key) or lone_surrogate_in(value):
                raise ValueError(f"{key} {_MESSAGE}")
        return self
