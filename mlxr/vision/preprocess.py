"""An RGB image -> the float32 pixel values [3, H, W] a vision tower takes, with the same numbers
as transformers' PIL-backed image processors: Pillow's own resize of the 8-bit image (so the
result is bit-identical, bicubic included), a rescale in float64 cast to float32, then
(x - mean) / std in float32."""
from __future__ import annotations

import math

import numpy as np
from PIL import Image

from mlxr.errors import InvalidParameterError
from mlxr.model_config import ImagePreprocess


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


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL smart_resize: (height, width) multiples of factor, the area within
    min_pixels..max_pixels, the aspect ratio kept as closely as that allows."""
    if max(height, width) / min(height, width) > 200:
        raise InvalidParameterError("images", f"an aspect ratio of {max(height, width) / min(height, width):.0f}, "
                                              "above the 200 this model takes")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _resized(image: Image.Image, p: ImagePreprocess) -> Image.Image:
    if p.resize_factor:
        height, width = smart_resize(image.height, image.width, p.resize_factor, p.min_pixels, p.max_pixels)
        return image.resize((width, height), resample=p.resample)
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
