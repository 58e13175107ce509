"""What the registry knows about one registered model."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from mlxr.registry.settings import ModelSettings

_UNITS = ((1_000_000_000, "B", 1), (1_000_000, "M", 2))


@dataclass(frozen=True)
class ModelRecord:
    """One registered model. Times are RFC 3339 strings in UTC; `last_used_at` is None until
    the model is first used."""

    name: str  # "name:tag"
    path: Path  # absolute, symlinks resolved: a .gguf file or an HF directory
    format: str  # "gguf" | "safetensors"
    architecture: str  # "gemma3", "llama", "qwen2", ...
    family: str
    parameter_count: int
    parameter_size: str  # format_parameter_count(parameter_count): "268.10M", "1.1B"
    quantization: str  # "Q4_K_M", "F16", "BF16", "F32", ...
    context_length: int
    size_bytes: int  # the file, or every file of the directory
    digest: str  # "sha256:<64 hex>"
    created_at: str
    modified_at: str
    last_used_at: str | None = None
    settings: ModelSettings = ModelSettings()  # SYSTEM, TEMPLATE, PARAMETER, MESSAGE
    projector: Path | None = None  # a GGUF model's mmproj file (llama.cpp's vision tower and projector)

    @property
    def short_id(self) -> str:
        """The first 12 hex digits of the digest, as `ollama list` shows it."""
        return self.digest.removeprefix("sha256:")[:12]

    @property
    def details(self) -> dict[str, object]:
        """Ollama's `details` object for /api/tags, /api/show and /api/ps."""
        return {
            "parent_model": "",
            "format": self.format,
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization,
        }


def format_parameter_count(n: int) -> str:
    """Ollama's style: "1.1B", "7B", "268.10M", "500M", "135K"."""
    for scale, suffix, decimals in _UNITS:
        if n >= scale:
            value = n / scale
            if value == int(value):
                return f"{int(value)}{suffix}"
            return f"{value:.{decimals}f}{suffix}"
    if n >= 1000:
        return f"{n / 1000:.0f}K"
    return str(n)


def rfc3339(t: datetime) -> str:
    """Fixed-width UTC form, so that the strings sort in time order."""
    return t.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def now_rfc3339() -> str:
    return rfc3339(datetime.now(timezone.utc))
