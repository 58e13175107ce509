"""Request text must be valid Unicode. JSON may escape a lone surrogate ("a\\ud800b"); Python
accepts it in a str, but the tokenizer cannot encode it. Refused at validation, so the 400
names the field instead of the tokenizer failing later with a 500."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, field_validator, model_validator


_SCALARS = {int, float, bool, type(None)}


def lone_surrogate_in(value: Any) -> bool:
    """True when a string anywhere in value (nested lists, dicts and their keys) has one."""
    if isinstance(value, str):
        if value.isascii():
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= _SCALARS:  # token-id lists: a C-speed pass, not a call per item
            return False
        return any(lone_surrogate_in(v) for v in value if type(v) not in _SCALARS)
    if isinstance(value, dict):
        return any(lone_surrogate_in(k) or lone_surrogate_in(v) for k, v in value.items())
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
