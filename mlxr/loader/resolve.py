"""Model references -> files on disk: a GGUF path, an HF directory, or the bundled model."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlxr.bundled_models import BUNDLED_REFS, bundled_path, gemma3_270m_path
from mlxr.errors import ModelNotFoundError

BUNDLED_MODELS = set(BUNDLED_REFS)


@dataclass(frozen=True)
class ModelSource:
    name: str  # what the user asked for
    path: Path
    format: str  # "gguf" | "hf"


def bundled_model_path() -> Path:
    """The bundled base model's file (Gemma 3 270M)."""
    return gemma3_270m_path()


def resolve_model(ref: str) -> ModelSource:
    if ref in BUNDLED_MODELS:
        return ModelSource(ref, bundled_path(ref), "gguf")
    path = Path(ref).expanduser()
    if path.is_file():
        return ModelSource(ref, path, "gguf")
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(ref, path, "hf")
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(ref, ggufs[0], "gguf")
    raise ModelNotFoundError(
        f"model {ref!r} not found: expected a .gguf file, a Hugging Face model directory "
        f"(config.json + *.safetensors), or one of {sorted(BUNDLED_MODELS)}"
    )
