"""Reading the small JSON and text files of a model directory: bounded size, one clear error."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlxr.errors import ModelFormatError

MAX_JSON_BYTES = 256 << 20  # tokenizer.json files of large vocabularies reach tens of MB


def read_json_object(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The JSON object in path; a missing, oversized, malformed or non-object file is a
    ModelFormatError naming the file."""
    data = read_json(path, max_bytes)
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} must hold a JSON object")
    return data


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in path (any kind); missing, oversized or malformed: ModelFormatError."""
    if not path.is_file():
        raise ModelFormatError(f"{path} is missing")
    if path.stat().st_size > max_bytes:
        raise ModelFormatError(f"{path} is larger than {max_bytes} bytes")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise ModelFormatError(f"{path} is not valid JSON: nested too deeply") from None
    except OSError as e:
        raise ModelFormatError(f"cannot read {path}: {e.strerror}") from None
    return data


MAX_TEMPLATE_BYTES = 1 << 20  # chat_template.jinja; the largest published ones are tens of KB


def check_text_file(path: Path, max_bytes: int = MAX_TEMPLATE_BYTES) -> None:
    """An optional UTF-8 text file (chat_template.jinja): if present, bounded and decodable."""
    if not path.is_file():
        return
    if path.stat().st_size > max_bytes:
        raise ModelFormatError(f"{path} is larger than {max_bytes} bytes")
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelFormatError(f"{path} is not UTF-8 text: {e}") from None
    except OSError as e:
        raise ModelFormatError(f"cannot read {path}: {e.strerror}") from None
