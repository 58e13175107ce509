"""An RGB image -> the float32 pixel values [3, H, W] a vision tower takes, with the same numbers
as transformers' PIL-backed image processors: Pillow's own resize of the 8-bit image (so the
result is bit-identical, bicubic included), a rescale in float64 cast to float32, then
(x - mean) / std in float32."""
from __future__ import annotations

import numpy as np
from PIL import Image

from mlxr.config import ImagePreprocess


def pixel_values(image: Image.Image, p: ImagePreprocess) -> np.ndarray:
    return normalized(np.asarray(_resized(image, p), dtype=np.uint8), p)


def normalized(x: np.ndarray, p: ImagePreprocess) -> np.ndarray:
    """8-bit [H, W, 3] -> rescaled, normalised float32 [3, H, W]."""
    out = x.astype(np.float64) * p.rescale_factor if p.do_rescale else x.astype(np.float64)
    out = out.astype(np.float32)
    if p.do_normalize:
        mean = np.asarray(p.image_mean, dtype=np.float32)
        std = np.asarray(p.image_std, dtype=np.float32)
        out = (out - mean) / std
    return np.ascontiguousarray(out.transpose(2, 0, 1))


def _resized(image: Image.Image, p: ImagePreprocess) -> Image.Image:
    if p.shortest_edge is None:
        return image.resize((p.width, p.height), resample=p.resample)
    width, height = image.size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = p.shortest_edge, int(p.shortest_edge * long / short)
    size = (new_short, new_long) if width <= height else (new_long, new_short)
    image = image.resize(size, resample=p.resample)
    return _center_crop(image, p.height, p.width)


def _center_crop(image: Image.Image, height: int, width: int) -> Image.Image:
    w, h = image.size
    top, left = (h - height) // 2, (w - width) // 2
    return image.crop((left, top, left + width, top + height))
