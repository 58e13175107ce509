"""The bounds on images a request may bring, each an MLXR_* switch read per request."""
from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_MAX_BYTES = 20 << 20
DEFAULT_MAX_PIXELS = 40_000_000  # a 8k x 5k photo; a 30k x 30k "bomb" is 900 M
DEFAULT_MAX_IMAGES = 8
DEFAULT_MAX_TILES = 37  # Idefics3's tiles an image: 6 x 6 (its row/col tokens run to 6) and the whole one


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = DEFAULT_MAX_BYTES  # the encoded file
    max_pixels: int = DEFAULT_MAX_PIXELS  # width x height, read from the header before decoding
    max_images: int = DEFAULT_MAX_IMAGES  # per request
    max_tiles: int = DEFAULT_MAX_TILES  # per image, where a model splits images into tiles (Idefics3)


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


def image_limits() -> ImageLimits:
    return ImageLimits(_positive("MLXR_MAX_IMAGE_BYTES", DEFAULT_MAX_BYTES),
                       _positive("MLXR_MAX_IMAGE_PIXELS", DEFAULT_MAX_PIXELS),
                       _positive("MLXR_MAX_IMAGES", DEFAULT_MAX_IMAGES),
                       _positive("MLXR_MAX_IMAGE_TILES", DEFAULT_MAX_TILES))
