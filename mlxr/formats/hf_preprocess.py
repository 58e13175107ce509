"""preprocessor_config.json (a transformers image processor's saved numbers) -> ImagePreprocess."""
from __future__ import annotations

from mlxr.errors import ModelFormatError
from mlxr.model_config import ImagePreprocess, ImageTiling

_FILTERS = (0, 1, 2, 3, 4, 5)  # PIL's NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING


TILE_SIDES = 8  # the most tiles a side an Idefics3 config may ask for (transformers' Idefics3 defaults: 4)
_IDEFICS3_RESAMPLE = 1  # transformers' Idefics3ImageProcessor default: LANCZOS


def preprocess_from_hf(cfg: dict, default_size: int, tiled: bool = False, resize_factor: int = 0) -> ImagePreprocess:
    """tiled: an Idefics3 / SmolVLM processor's keys (size.longest_edge, max_image_size,
    do_image_splitting) in place of a fixed size. resize_factor: Qwen2-VL's processor (size
    shortest_edge / longest_edge as the least and most pixels, sides multiples of the factor)."""
    if not isinstance(cfg, dict):
        raise ModelFormatError("preprocessor_config.json must hold a JSON object")
    if cfg.get("do_pan_and_scan"):
        raise ModelFormatError("preprocessor_config.json: do_pan_and_scan is not supported")
    if tiled:
        return _tiled(cfg, default_size)
    if resize_factor:
        return _smart_resized(cfg, resize_factor)
    height, width, shortest = _size(cfg.get("size"), default_size)
    crop = cfg.get("crop_size")
    if shortest is not None and cfg.get("do_center_crop", True) and isinstance(crop, dict):
        height, width = _side(crop, "height", height), _side(crop, "width", width)
    return ImagePreprocess(height=height, width=width, shortest_edge=shortest, **_common(cfg, 2))


def _common(cfg: dict, default_resample: int) -> dict:
    resample = cfg.get("resample", default_resample)
    if resample not in _FILTERS:
        raise ModelFormatError(f"preprocessor_config.json: resample {resample!r} is not a PIL filter")
    return dict(
        resample=resample, rescale_factor=_number(cfg, "rescale_factor", 1 / 255),
        image_mean=_triple(cfg, "image_mean", (0.5, 0.5, 0.5)), image_std=_triple(cfg, "image_std", (0.5, 0.5, 0.5)),
        do_rescale=bool(cfg.get("do_rescale", True)), do_normalize=bool(cfg.get("do_normalize", True)),
    )


def _tiled(cfg: dict, tower_side: int) -> ImagePreprocess:
    if cfg.get("do_resize", True) is not True:
        raise ModelFormatError("preprocessor_config.json: an Idefics3 processor without do_resize is not supported")
    tile = _side(_object(cfg, "max_image_size"), "longest_edge", tower_side)
    if tile != tower_side:  # the tower's positions and the prompt's token count assume whole tiles of its size
        raise ModelFormatError(f"preprocessor_config.json: max_image_size.longest_edge {tile} is not the tower's "
                               f"image_size {tower_side}")
    longest = _side(_object(cfg, "size"), "longest_edge", 4 * tile)
    if -(-longest // tile) > TILE_SIDES:
        raise ModelFormatError(f"preprocessor_config.json: size.longest_edge {longest} makes more than {TILE_SIDES} "
                               f"tiles of {tile} a side")
    tiling = ImageTiling(longest_edge=longest, tile=tile, split=bool(cfg.get("do_image_splitting", True)))
    common = _common(cfg, _IDEFICS3_RESAMPLE)
    return ImagePreprocess(height=tile, width=tile, tiling=tiling, **common)


MAX_SMART_PIXELS = 28 * 28 * 16384  # Qwen2.5-VL's own largest max_pixels: 16384 tokens an image
_CLIP_MEAN, _CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def _smart_resized(cfg: dict, factor: int) -> ImagePreprocess:
    size = _object(cfg, "size")
    least = _pixels(cfg.get("min_pixels", size.get("shortest_edge", 56 * 56)), "min_pixels")
    most = _pixels(cfg.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280)), "max_pixels")
    if least > most:
        raise ModelFormatError(f"preprocessor_config.json: min_pixels {least} above max_pixels {most}")
    common = _common({"image_mean": _CLIP_MEAN, "image_std": _CLIP_STD, **cfg}, 3)
    return ImagePreprocess(height=factor, width=factor, resize_factor=factor, min_pixels=least, max_pixels=most,
                           **common)


def _pixels(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SMART_PIXELS:
        raise ModelFormatError(f"preprocessor_config.json: {key} must be an integer in 1..{MAX_SMART_PIXELS}, "
                               f"got {value!r}")
    return value


def _object(cfg: dict, key: str) -> dict:
    value = cfg.get(key, {})
    if not isinstance(value, dict):
        raise ModelFormatError(f"preprocessor_config.json: {key} must be an object, got {value!r}")
    return value


def _size(size, default: int) -> tuple[int, int, int | None]:
    if size is None:
        return default, default, None
    if isinstance(size, dict) and "shortest_edge" in size:
        edge = _side(size, "shortest_edge", default)
        return edge, edge, edge
    if isinstance(size, dict):
        return _side(size, "height", default), _side(size, "width", default), None
    raise ModelFormatError(f"preprocessor_config.json: size must be an object, got {size!r}")


def _side(d: dict, key: str, default: int) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 8192:
        raise ModelFormatError(f"preprocessor_config.json: {key} must be an integer in 1..8192, got {value!r}")
    return value


def _number(cfg: dict, key: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ModelFormatError(f"preprocessor_config.json: {key} must be a positive number, got {value!r}")
    return float(value)


def _triple(cfg: dict, key: str, default: tuple[float, float, float]) -> tuple[float, float, float]:
    value = cfg.get(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * 3
    if not isinstance(value, (list, tuple)) or len(value) != 3 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise ModelFormatError(f"preprocessor_config.json: {key} must be three numbers, got {value!r}")
    if key == "image_std" and any(x <= 0 for x in value):
        raise ModelFormatError("preprocessor_config.json: image_std must be positive")
    return float(value[0]), float(value[1]), float(value[2])
