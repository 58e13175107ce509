"""Encoded image bytes -> one RGB Pillow image, within bounds: the size in bytes, the pixel count
read from the header before any pixel is decoded (a decompression bomb never expands), the first
frame of an animated file, the EXIF orientation applied, every mode converted to 8-bit RGB
(alpha composited on white, as transformers' convert_to_rgb does)."""
from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mlxr.errors import InvalidParameterError
from mlxr.vision.limits import ImageLimits

_HIGH_DEPTH = {"I;16", "I;16B", "I;16L", "I;16N", "I"}  # 16-bit PNG/TIFF and 32-bit integer
_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")


def decode_image(data: bytes, limits: ImageLimits, name: str = "image") -> Image.Image:
    """The image in data as RGB; InvalidParameterError(name, why) for anything else."""
    if len(data) > limits.max_bytes:
        raise InvalidParameterError(name, f"the image is {len(data)} bytes, above the limit of {limits.max_bytes} "
                                          "(MLXR_MAX_IMAGE_BYTES)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=_FORMATS)
            width, height = image.size
            if width * height > limits.max_pixels:
                raise InvalidParameterError(name, f"the image is {width} x {height} pixels, above the limit of "
                                                  f"{limits.max_pixels} (MLXR_MAX_IMAGE_PIXELS)")
            image.seek(0)  # the first frame of an animated file
            image.load()
            image = ImageOps.exif_transpose(image)
    except InvalidParameterError:
        raise
    except Image.DecompressionBombError:  # Pillow's own header check, far above ours
        raise InvalidParameterError(name, f"the image's header claims more pixels than the limit of "
                                          f"{limits.max_pixels} (MLXR_MAX_IMAGE_PIXELS)") from None
    except UnidentifiedImageError:
        raise InvalidParameterError(name, "not an image in a known format (PNG, JPEG, GIF, WebP, BMP, TIFF)") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise InvalidParameterError(name, f"the image could not be decoded ({e.__class__.__name__}: {e})") from None
    return to_rgb(image)


def to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in _HIGH_DEPTH or image.mode == "F":
        image = _to_8bit(image)
    if image.mode == "CMYK":
        return image.convert("RGB")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit (and 32-bit integer, float) grey scaled to 0-255 by its type's range; Pillow's own
    convert would clip everything above 255 to white."""
    values = np.asarray(image)
    if image.mode == "F":
        scaled = np.clip(values, 0.0, 1.0) * 255.0
    else:
        top = 65535.0 if image.mode.startswith("I;16") or values.max(initial=0) <= 65535 else float(values.max())
        scaled = np.clip(values.astype(np.float64), 0, top) * (255.0 / top)
    return Image.fromarray(np.round(scaled).astype(np.uint8))
