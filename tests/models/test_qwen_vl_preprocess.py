"""Qwen2.5-VL's pixels against transformers' Qwen2VLImageProcessorPil on the 20 generated images
(real-world sizes, aspect ratios, modes, formats): the smart-resize size (image_grid_thw) and the
flat patches (pixel_values) equal bit for bit, with its defaults (14-pixel patches merged 2 x 2,
3136..1003520 pixels) and with a tight pixel range that forces the down- and up-scaling paths."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from image_fixtures import IMAGE_CASES, encoded

from mlxr.errors import InvalidParameterError, ModelFormatError
from mlxr.formats.hf_preprocess import MAX_SMART_PIXELS, preprocess_from_hf
from mlxr.models.vision.qwen_vit import flat_patches
from mlxr.vision.decode import decode_image
from mlxr.vision.limits import ImageLimits
from mlxr.vision.preprocess import pixel_values, smart_resize

pytest.importorskip("PIL.Image")
CASES = [pytest.param(c, id=f"{c[0]}x{c[1]}-{c[2]}-{c[3]}") for c in IMAGE_CASES]
_SETTINGS = {"default": {}, "tight": {"size": {"shortest_edge": 28 * 28 * 16, "longest_edge": 28 * 28 * 64}}}


@pytest.fixture(scope="module")
def processors():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out = {}
    for name, kwargs in _SETTINGS.items():
        hf = Qwen2VLImageProcessorPil(**kwargs)
        out[name] = hf, preprocess_from_hf(hf.to_dict(), 0, resize_factor=28)
    return out


@pytest.mark.parametrize("case", CASES)
def test_qwen_vl_pixels_equal_transformers(processors, case):
    image = decode_image(encoded(*case), ImageLimits())
    if max(image.size) / min(image.size) > 200:
        pytest.skip("transformers refuses it too")
    for name, (hf, pre) in processors.items():
        want = hf(image, return_tensors="np")
        got, grid = flat_patches(torch.from_numpy(pixel_values(image, pre)), 14, 2, 2)
        assert list(grid) == want["image_grid_thw"][0].tolist(), name
        assert np.abs(got.numpy() - want["pixel_values"]).max() == 0.0, name


def test_extreme_aspect_is_refused_and_pixel_bounds_read():
    with pytest.raises(InvalidParameterError):
        smart_resize(10, 2100, 28, 56 * 56, 28 * 28 * 1280)
    with pytest.raises(ModelFormatError):
        preprocess_from_hf({"size": {"shortest_edge": 3136, "longest_edge": MAX_SMART_PIXELS + 1}}, 0, resize_factor=28)
    with pytest.raises(ModelFormatError):
        preprocess_from_hf({"size": {"shortest_edge": 10_000, "longest_edge": 5_000}}, 0, resize_factor=28)
