"""Images as Python callers and the terminal hold them (a PIL image, a file path, the file's
bytes) -> file bytes, and chat messages whose image parts become the model's image marker."""
from __future__ import annotations

import io
import re
from pathlib import Path

from mlxr.errors import InvalidParameterError
from mlxr.vision.limits import image_limits


_PATH = re.compile(r"""(?:(?<=\s)|^)(['"]?)((?:[^\s'"]|\\ )+\.(?:png|jpe?g|webp|gif|bmp|tiff?))\1(?=\s|$)""", re.I)


def paths_in(text: str) -> tuple[str, list[Path]]:
    """The image files a terminal message names (as `ollama run` finds them: words ending in an
    image extension that are existing files, quoted or with spaces escaped), and the text
    without them."""
    found: list[Path] = []

    def take(m: re.Match) -> str:
        path = Path(m.group(2).replace("\\ ", " ")).expanduser()
        if not path.is_file():
            return m.group(0)
        found.append(path)
        return ""

    return _PATH.sub(take, text).strip(), found


def image_bytes(image: object, name: str) -> bytes:
    if isinstance(image, (bytes, bytearray)):
        return bytes(image)
    if isinstance(image, (str, Path)):
        return _read(Path(image), name)
    if hasattr(image, "save") and hasattr(image, "mode"):  # a PIL image: sent on as PNG
        buf = io.BytesIO()
        image.save(buf, "PNG")
        return buf.getvalue()
    raise InvalidParameterError(name, "an image must be a PIL image, a file path or the file's bytes")


def _read(path: Path, name: str) -> bytes:
    limit = image_limits().max_bytes
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InvalidParameterError(name, f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise InvalidParameterError(name, f"{path} is above the limit of {limit} bytes (MLXR_MAX_IMAGE_BYTES)")
    return data


def message_images(messages: list[dict], marker: str | None) -> tuple[list[dict], tuple[bytes, ...]]:
    """The messages with each image part turned into `marker` in the text (None: a text-only
    model, which refuses them), and the images in order."""
    out, images = [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image":
                if marker is None:
                    raise InvalidParameterError(f"messages[{i}].content[{j}]", "this model takes text only")
                images.append(image_bytes(part.get("image"), f"messages[{i}].content[{j}]"))
                texts.append(marker)
            elif kind == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise InvalidParameterError(f"messages[{i}].content[{j}]", f"parts of type {kind!r} are not supported")
        out.append({**m, "content": "".join(texts)})
    return out, tuple(images)
