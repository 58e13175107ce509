"""Pixel values against transformers' own PIL-backed image processors on 20 generated images of
real-world sizes, aspect ratios, modes and formats. Both resize with Pillow on the same 8-bit
RGB image and rescale and normalise with the same float ops in the same order, so the values are
equal bit for bit, bicubic included: the tolerance is 0."""
from __future__ import annotations

import io

import numpy as np
import pytest

from image_fixtures import IMAGE_CASES, encoded

from mlxr.config import ImagePreprocess
from mlxr.formats.hf_preprocess import preprocess_from_hf
from mlxr.vision.decode import decode_image
from mlxr.vision.limits import ImageLimits
from mlxr.vision.preprocess import pixel_values

PIL = pytest.importorskip("PIL.Image")
CASES = [pytest.param(c, id=f"{c[0]}x{c[1]}-{c[2]}-{c[3]}") for c in IMAGE_CASES]


def _processors():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    return {
        "gemma3-896-bilinear": Gemma3ImageProcessorPil(size={"height": 896, "width": 896}),
        "siglip-224-bicubic": SiglipImageProcessorPil(size={"height": 224, "width": 224}, resample=3),
        "clip-shortest-crop-bicubic": CLIPImageProcessorPil(),
    }


@pytest.fixture(scope="module")
def processors():
    return {name: (p, preprocess_from_hf(p.to_dict(), 224)) for name, p in _processors().items()}


@pytest.mark.parametrize("case", CASES)
def test_pixel_values_equal_transformers(processors, case):
    data = encoded(*case)
    ours_rgb = decode_image(data, ImageLimits())
    for name, (hf, pre) in processors.items():
        want = hf(ours_rgb, return_tensors="np")["pixel_values"][0]
        got = pixel_values(ours_rgb, pre)
        assert got.shape == want.shape, name
        assert got.dtype == np.float32
        assert np.abs(got - want).max() == 0.0, name
    if case[2] != "I;16":  # transformers' own RGB conversion of the file: ours is the same
        hf, pre = processors["siglip-224-bicubic"]
        raw = PIL.open(io.BytesIO(data))
        assert np.array_equal(pixel_values(ours_rgb, pre), hf(raw, return_tensors="np")["pixel_values"][0])


def test_preprocessor_config_read_as_transformers_saved_it(processors):
    _, clip = processors["clip-shortest-crop-bicubic"]
    assert clip == ImagePreprocess(height=224, width=224, shortest_edge=224, resample=3, rescale_factor=1 / 255,
                                   image_mean=clip.image_mean, image_std=clip.image_std)
    assert clip.image_mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    _, gemma = processors["gemma3-896-bilinear"]
    assert (gemma.height, gemma.width, gemma.resample, gemma.shortest_edge) == (896, 896, 2, None)


def test_sixteen_bit_grey_keeps_its_range():
    """transformers' convert('RGB') clips a 16-bit PNG to white above 255; ours scales it."""
    img = decode_image(encoded(64, 64, "I;16", "PNG"), ImageLimits())
    values = np.asarray(img)
    assert img.mode == "RGB" and 0 < values.mean() < 250
