"""Images as the APIs send them -> file bytes: Ollama's base64 strings, OpenAI's data URLs
(remote http(s) URLs only with `serve --allow-remote-images`), Anthropic's base64 sources. The
size is checked before anything is decoded; the bytes then go to mlxr/vision/."""
from __future__ import annotations

import base64
import binascii
import re

from mlxr.errors import InvalidParameterError
from mlxr.model_config import VisionArgs
from mlxr.types import ImagePrompt, ImagePromptIds
from mlxr.vision.image_prompt import check_takes_images, image_prompt_ids
from mlxr.vision.limits import image_limits

_DATA_URL = re.compile(r"data:(image/[a-z0-9.+-]+)?(;[a-z0-9=.+-]+)*;base64,", re.I)


def base64_image(text: object, name: str) -> bytes:
    if not isinstance(text, str):
        raise InvalidParameterError(name, "an image must be a base64 string")
    limit = image_limits().max_bytes
    if len(text) > (limit + 2) // 3 * 4 + 4:
        raise InvalidParameterError(name, f"the image is above the limit of {limit} bytes (MLXR_MAX_IMAGE_BYTES)")
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameterError(name, "the image is not valid base64") from None


def url_image(url: object, name: str, allow_remote: bool) -> bytes:
    """A data: URL's bytes; an http(s) URL is refused unless the server allows remote images
    (it would make the server request any address a client names, internal ones included)."""
    if not isinstance(url, str):
        raise InvalidParameterError(name, "image_url.url must be a string")
    m = _DATA_URL.match(url)
    if m is not None:
        return base64_image(url[m.end():], name)
    if url.startswith(("http://", "https://")):
        if not allow_remote:
            raise InvalidParameterError(name, "remote image URLs are refused (the server would fetch any "
                                              "address); send a data: URL, or start the server with "
                                              "--allow-remote-images")
        return fetch_remote(url, name)
    raise InvalidParameterError(name, "image_url.url must be a data:image/...;base64, URL")


def fetch_remote(url: str, name: str) -> bytes:
    """GET url with a time and size bound (only with --allow-remote-images)."""
    import urllib.error
    import urllib.request

    limit = image_limits().max_bytes
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "mlxr"}), timeout=10) as r:
            data = r.read(limit + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise InvalidParameterError(name, f"the image URL could not be fetched ({e})") from None
    if len(data) > limit:
        raise InvalidParameterError(name, f"the image is above the limit of {limit} bytes (MLXR_MAX_IMAGE_BYTES)")
    return data


class ImageSources:
    """A chat request's images as its messages name them, in order, fetched and decoded off
    the event loop (prompt_ids) once the template has written a marker for each."""

    def __init__(self, vision: VisionArgs | None, allow_remote: bool) -> None:
        self.vision, self.allow_remote = vision, allow_remote
        self.sources: list[tuple[str, str, object]] = []  # (param name, "url" | "base64", value)

    def __bool__(self) -> bool:
        return bool(self.sources)

    def add(self, name: str, spec: object, kind: str = "url", part: str = "image_url") -> str:
        """Keep an image part's source; returns the marker text standing for it."""
        if self.vision is None:
            raise InvalidParameterError(name, f"this model takes text only: parts of type {part!r} are not supported")
        if kind == "url" and isinstance(spec, dict):
            spec = spec.get("url")
        self.sources.append((name, kind, spec))
        check_takes_images(self.vision, len(self.sources))
        return self.vision.image_marker

    def prompt_ids(self, text: str, tokenizer) -> ImagePromptIds:
        files = tuple(url_image(v, n, self.allow_remote) if kind == "url" else base64_image(v, n)
                      for n, kind, v in self.sources)
        names = tuple(n for n, _, _ in self.sources)
        return image_prompt_ids(ImagePrompt(text, files, False, names), self.vision, tokenizer)
