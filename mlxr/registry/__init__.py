"""Model registry: names (`name:tag`) -> model files on disk, in SQLite. Never imports torch."""
from mlxr.registry.db import RegistryError
from mlxr.registry.names import parse_name
from mlxr.registry.record import ModelRecord, format_parameter_count
from mlxr.registry.registry import BUNDLED_NAME, Registry, bundled_model_path

__all__ = [
    "BUNDLED_NAME", "ModelRecord", "Registry", "RegistryError", "bundled_model_path",
    "format_parameter_count", "parse_name",
]
