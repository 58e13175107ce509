"""A model's own sampling defaults: what its files ask for (generation_config.json, GGUF's
general.sampling.* keys), the shipped preset of a bundled model, and its Modelfile PARAMETERs,
in that order of precedence. A request's own values win over all of them; the routes fall
back to their API's defaults (OpenAI's temperature 1, Ollama's 0.8/40/0.9/1.1) last."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxr.bundled_models import BUNDLED_SAMPLING
from mlxr.errors import ModelFormatError
from mlxr.formats.json_file import read_json_object

log = logging.getLogger("mlxr.loader")

# Ollama's option name -> (SamplingParams field, lowest, highest, integer?)
FIELDS: dict[str, tuple[str, float, float, bool]] = {
    "temperature": ("temperature", 0.0, 100.0, False),
    "top_k": ("top_k", 0, 1 << 20, True),
    "top_p": ("top_p", 0.0, 1.0, False),
    "min_p": ("min_p", 0.0, 1.0, False),
    "repeat_penalty": ("repetition_penalty", 0.01, 100.0, False),
}
_HF_KEYS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
            "repetition_penalty": "repeat_penalty"}
_GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
              "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
              "general.sampling.penalty_repeat": "repeat_penalty"}


@dataclass(frozen=True)
class SamplingDefaults:
    """Ollama option name -> value, and where each value came from."""

    values: dict[str, float | int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def ours(self) -> dict[str, float | int]:
        """The same values under SamplingParams' field names."""
        return {FIELDS[name][0]: value for name, value in self.values.items()}

    def get(self, field_name: str, fallback: Any) -> Any:
        """One SamplingParams field's default, else the API's fallback."""
        return self.ours().get(field_name, fallback)

    def merged(self, values: dict[str, Any], source: str) -> "SamplingDefaults":
        picked = checked(values, source)
        return SamplingDefaults({**self.values, **picked}, {**self.sources, **{k: source for k in picked}})

    def parameters_text(self) -> str:
        """Ollama's `parameters` lines for /api/show."""
        return "\n".join(f"{name} {value}" for name, value in self.values.items())


def checked(values: dict[str, Any], source: str) -> dict[str, float | int]:
    """The known, in-range numeric values; anything else is skipped with a warning (a model
    file's odd generation_config must not stop it loading)."""
    out: dict[str, float | int] = {}
    for name, value in values.items():
        if name not in FIELDS:
            continue
        _, low, high, integer = FIELDS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high or (integer and value != int(value)):
            log.warning("ignoring the sampling default %s=%r from %s", name, value, source)
            continue
        out[name] = int(value) if integer else float(value)
    return out


def _hf_values(root: Path) -> dict[str, Any]:
    path = root / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = read_json_object(path, max_bytes=1 << 20)
    except ModelFormatError as e:
        log.warning("no sampling defaults read: %s", e)
        return {}
    # transformers' greedy default (do_sample false) is no sampling setting of the model's own.
    if config.get("do_sample") is False:
        return {}
    return {ours: config[key] for key, ours in _HF_KEYS.items() if key in config}


def _gguf_values(metadata: dict[str, Any]) -> dict[str, Any]:
    return {ours: metadata[key] for key, ours in _GGUF_KEYS.items() if key in metadata}


def file_defaults(path: Path, fmt: str) -> SamplingDefaults:
    if fmt == "gguf":
        from mlxr.formats.gguf import open_gguf

        with open_gguf(path) as f:
            values, source = _gguf_values(f.metadata), "gguf"
    else:
        values, source = _hf_values(path), "generation_config.json"
    return SamplingDefaults().merged(values, source)


def model_sampling_defaults(record) -> SamplingDefaults:
    """All of a registered model's defaults: its files, its bundled preset, its Modelfile."""
    defaults = file_defaults(Path(record.path), record.format)
    preset = BUNDLED_SAMPLING.get(record.name)
    if preset:
        defaults = defaults.merged(preset, "preset")
    return defaults.merged(record.settings.parameters, "Modelfile")
