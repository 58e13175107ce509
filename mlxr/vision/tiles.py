"""Idefics3's image splitting (transformers' Idefics3ImageProcessor / SmolVLMImageProcessor, PIL
backend), with the same numbers: the longest edge resized to `longest_edge` (the other edge
rounded up to even, both kept under 4096), then both edges resized up to whole tiles, cut into
tiles row by row, and the whole image resized to one tile last; an image no larger than a tile is
that one image. Every resize is Pillow's on the 8-bit image, as theirs is. Each tile is then
rescaled and normalised (preprocess.normalized). Tiles are all `tile` x `tile`, so transformers'
padding never applies to them and its pixel_attention_mask is all ones."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mlxr.errors import InvalidParameterError
from mlxr.model_config import ImagePreprocess, ImageTiling
from mlxr.vision.preprocess import normalized

MAX_SIDE = 4096  # transformers' MAX_IMAGE_SIZE for Idefics3


@dataclass(frozen=True)
class Tiles:
    pixels: list[np.ndarray]  # float32 [3, tile, tile] each: rows x cols tiles, then the whole image
    rows: int  # 0 (and cols 0): the whole image alone
    cols: int


def tiled_pixel_values(image: Image.Image, p: ImagePreprocess, max_tiles: int, name: str = "image") -> Tiles:
    t = p.tiling
    assert t is not None
    image = image.resize(_longest_edge_size(image.size, t.longest_edge), resample=p.resample)
    if not t.split:
        return Tiles([normalized(_array(image.resize((t.tile, t.tile), resample=p.resample)), p)], 0, 0)
    image = image.resize(_whole_tiles_size(image.size, t.tile), resample=p.resample)
    width, height = image.size
    if width <= t.tile and height <= t.tile:
        return Tiles([normalized(_array(image), p)], 0, 0)
    rows, cols = (height - t.tile) // t.tile + 1, (width - t.tile) // t.tile + 1
    if rows * cols + 1 > max_tiles:
        raise InvalidParameterError(name, f"the image splits into {rows * cols + 1} tiles, above the limit of "
                                          f"{max_tiles} (MLXR_MAX_IMAGE_TILES)")
    x = _array(image)
    crops = [x[r * t.tile:(r + 1) * t.tile, c * t.tile:(c + 1) * t.tile] for r in range(rows) for c in range(cols)]
    whole = _array(image.resize((t.tile, t.tile), resample=p.resample))
    return Tiles([normalized(np.ascontiguousarray(c), p) for c in crops] + [normalized(whole, p)], rows, cols)


def tile_count_bound(t: ImageTiling) -> int:
    """The most tiles an image can give under this tiling (the config's own bound)."""
    side = math.ceil(min(t.longest_edge, MAX_SIDE) / t.tile)
    return side * side + 1 if t.split else 1


def _array(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.uint8)


def _longest_edge_size(size: tuple[int, int], longest: int) -> tuple[int, int]:
    """(width, height) as transformers' _resize_output_size_rescale_to_max_len, then
    _resize_output_size_scale_below_upper_bound, compute them."""
    width, height = size
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    width, height = max(width, 1), max(height, 1)
    aspect = width / height
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / aspect)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * aspect)
    return max(width, 1), max(height, 1)


def _whole_tiles_size(size: tuple[int, int], tile: int) -> tuple[int, int]:
    """(width, height) as transformers' resize_for_vision_encoder computes them."""
    width, height = size
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return width, height


def tile_sequence(tiles: Tiles, placeholders: str) -> str:
    """The prompt text of one image as transformers' Idefics3Processor writes it."""
    whole = f"<fake_token_around_image><global-img>{placeholders}<fake_token_around_image>"
    if tiles.rows == 0 and tiles.cols == 0:
        return whole
    text = ""
    for r in range(tiles.rows):
        for c in range(tiles.cols):
            text += f"<fake_token_around_image><row_{r + 1}_col_{c + 1}>{placeholders}"
        text += "\n"
    return text + "\n" + whole
