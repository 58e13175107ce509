"""The LoRA adapters the server serves, by name: each with its base model (a registry name)
and its file. A request names an adapter as its `model` (vLLM's habit); the base's engine runs
it with the adapter. A base loaded later (or again) loads its adapters with it."""
from __future__ import annotations

from dataclasses import dataclass

from mlxr.errors import InvalidParameterError

MAX_ADAPTER_NAME = 256
MAX_PATH_CHARS = 4096


@dataclass(frozen=True)
class ServedAdapter:
    name: str
    base: str  # the registry name of the model it adapts
    path: str


def check_adapter_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_ADAPTER_NAME:
        raise InvalidParameterError("lora_name", f"must be a name of 1 to {MAX_ADAPTER_NAME} characters")
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        raise InvalidParameterError("lora_name", "must not hold control characters")
    return name


class AdapterTable:
    def __init__(self) -> None:
        self.adapters: dict[str, ServedAdapter] = {}

    def get(self, name: str | None) -> ServedAdapter | None:
        return self.adapters.get(name) if name else None

    def add(self, adapter: ServedAdapter) -> None:
        self.adapters[adapter.name] = adapter

    def remove(self, name: str) -> ServedAdapter | None:
        return self.adapters.pop(name, None)

    def for_base(self, base: str) -> tuple[tuple[str, str], ...]:
        return tuple((a.name, a.path) for a in self.adapters.values() if a.base == base)
