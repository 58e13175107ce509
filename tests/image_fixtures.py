"""Generated images for the vision tests: real-world shapes (photo, portrait, panorama, tiny,
odd sizes) and modes (RGB, RGBA, L, LA, P, P with transparency, CMYK, 16-bit grey), saved in
the formats clients send. Deterministic; no file from elsewhere."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np

# (width, height, mode, format)
IMAGE_CASES = [
    (640, 480, "RGB", "JPEG"), (480, 640, "RGB", "PNG"), (1920, 1080, "RGB", "JPEG"), (1080, 1920, "RGB", "WEBP"),
    (3000, 400, "RGB", "PNG"), (400, 3000, "RGB", "PNG"), (32, 32, "RGB", "PNG"), (1, 1, "RGB", "PNG"),
    (7, 300, "RGB", "BMP"), (333, 333, "RGBA", "PNG"), (250, 120, "L", "PNG"), (120, 250, "LA", "PNG"),
    (200, 150, "P", "GIF"), (150, 200, "P", "PNG"), (300, 200, "CMYK", "JPEG"), (256, 256, "I;16", "PNG"),
    (1023, 767, "RGB", "JPEG"), (31, 17, "RGBA", "WEBP"), (800, 800, "RGB", "TIFF"), (45, 2000, "L", "JPEG"),
]


def picture(width: int, height: int, mode: str, seed: int = 0):
    """A smooth gradient with noise and a few hard edges, so resizing filters matter."""
    from PIL import Image

    rng = np.random.default_rng([seed, width, height])
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / max(width - 1, 1), y / max(height - 1, 1), ((x + y) % 37) / 36.0], axis=-1)
    noisy = np.clip(base * 200 + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    noisy[height // 3: height // 2, width // 4: width // 3] = (250, 10, 10)
    rgb = Image.fromarray(noisy)
    if mode == "RGBA" or mode == "LA":
        alpha = Image.fromarray(((x * 255 / max(width, 1)) % 256).astype(np.uint8))
        img = rgb.convert("RGBA" if mode == "RGBA" else "L").copy()
        img.putalpha(alpha)
        return img
    if mode == "P":
        img = rgb.quantize(64)
        img.info["transparency"] = 0
        return img
    if mode == "I;16":
        return Image.fromarray(noisy[..., 0].astype(np.uint16) * 257)
    return rgb.convert(mode)


def encoded(width: int, height: int, mode: str, fmt: str, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    picture(width, height, mode, seed).save(buf, fmt)
    return buf.getvalue()


def png(width: int = 40, height: int = 30, seed: int = 0) -> bytes:
    return encoded(width, height, "RGB", "PNG", seed)


def solid(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "PNG")
    return buf.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR says width x height (a decompression bomb's header)."""
    data = bytearray(png(1, 1))
    ihdr = 8 + 8  # signature, then the IHDR chunk's length and type
    data[ihdr:ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[12:ihdr + 13]))
    data[ihdr + 13:ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)
