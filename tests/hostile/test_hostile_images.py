"""Hostile, broken and awkward images: each is refused with a 400 naming the image (its index),
in bounded time and memory, or decoded the way a viewer shows it (first frame, EXIF rotation,
CMYK and 16-bit converted). A bomb is refused from its header: no pixel is decoded."""
from __future__ import annotations

import io
import time
import tracemalloc

import numpy as np
import pytest

from image_fixtures import encoded, png_claiming

from mlxr.errors import InvalidParameterError
from mlxr.vision.decode import decode_image
from mlxr.vision.limits import ImageLimits, image_limits

PIL = pytest.importorskip("PIL.Image")
LIMITS = ImageLimits()


def refused(data: bytes, match: str, limits: ImageLimits = LIMITS) -> InvalidParameterError:
    with pytest.raises(InvalidParameterError, match=match) as e:
        decode_image(data, limits, "images[3]")
    assert e.value.param == "images[3]"
    return e.value


@pytest.mark.parametrize("size", [(30000, 30000), (1 << 20, 1 << 20), (400_000, 101)], ids=["30k", "1M", "long"])
def test_bombs_are_refused_from_the_header_in_bounded_time_and_memory(size):
    tracemalloc.start()
    t0 = time.perf_counter()
    refused(png_claiming(*size), "MLXR_MAX_IMAGE_PIXELS")
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0 and peak < 16 << 20


def test_a_bomb_jpeg_of_real_pixels_is_refused_too():
    limits = ImageLimits(max_pixels=1000 * 1000)
    refused(encoded(1200, 1000, "RGB", "JPEG"), "1200 x 1000 pixels", limits)


@pytest.mark.parametrize("data", [b"", b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b"GIF89a" + b"\xff" * 20],
                         ids=["empty", "text", "png-signature-only", "gif-garbage"])
def test_corrupt_files_are_400s(data):
    refused(data, "images\\[3\\]: ")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_truncated_files_are_400s(fmt):
    data = encoded(300, 200, "RGB", fmt)
    refused(data[: len(data) // 2], "could not be decoded|not an image")


def test_the_byte_limit(monkeypatch):
    monkeypatch.setenv("MLXR_MAX_IMAGE_BYTES", "1000")
    refused(encoded(300, 300, "RGB", "PNG"), "MLXR_MAX_IMAGE_BYTES", image_limits())


def test_an_animated_gif_gives_its_first_frame():
    frames = [PIL.new("RGB", (20, 10), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    img = decode_image(buf.getvalue(), LIMITS)
    assert img.size == (20, 10) and np.asarray(img)[5, 5].tolist() == [255, 0, 0]


def test_exif_orientation_is_applied():
    img = PIL.new("RGB", (40, 20), (200, 10, 10))
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif.tobytes())
    assert decode_image(buf.getvalue(), LIMITS).size == (20, 40)


@pytest.mark.parametrize("mode,fmt", [("CMYK", "JPEG"), ("I;16", "PNG"), ("LA", "PNG"), ("P", "GIF"), ("RGBA", "WEBP")])
def test_modes_become_8_bit_rgb(mode, fmt):
    img = decode_image(encoded(64, 48, mode, fmt), LIMITS)
    assert img.mode == "RGB" and img.size == (64, 48)


def test_too_many_images_and_a_text_only_model_are_refused():
    from mlxr.model_config import VisionArgs
    from mlxr.vision.image_prompt import check_takes_images

    with pytest.raises(InvalidParameterError, match="text only"):
        check_takes_images(None, 1)
    vision = VisionArgs("siglip", "gemma3", 8, 8, 1, 1, 8, 4, 1e-6, "gelu_pytorch_tanh", 4, 9, "<img>", "{image}", "<s>")
    with pytest.raises(InvalidParameterError, match="MLXR_MAX_IMAGES"):
        check_takes_images(vision, LIMITS.max_images + 1)
