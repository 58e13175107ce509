"""Pixel values against transformers' own PIL-backed image processors on 20 generated images of
real-world sizes, aspect ratios, modes and formats. Both resize with Pillow on the same 8-bit
RGB image and rescale and normalise with the same float ops in the same order, so the values are
equal bit for bit, bicubic included: the tolerance is 0."""
from __future__ import annotations

import io

import numpy as np
import pytest

from image_fixtures import IMAGE_CASES, encoded

from mlxr.formats.hf_preprocess import preprocess_from_hf
from mlxr.model_config import ImagePreprocess
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


def _tiling_processors():
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    return {
        "idefics3-1456-364": (Idefics3ImageProcessorPil(), 364),
        "smolvlm-2048-512": (SmolVLMImageProcessorPil(size={"longest_edge": 2048},
                                                      max_image_size={"longest_edge": 512}), 512),
        "smolvlm-unsplit-bicubic": (SmolVLMImageProcessorPil(size={"longest_edge": 1024}, resample=3,
                                                             max_image_size={"longest_edge": 512},
                                                             do_image_splitting=False), 512),
    }


@pytest.fixture(scope="module")
def tiling_processors():
    return {name: (p, preprocess_from_hf(p.to_dict(), side, tiled=True))
            for name, (p, side) in _tiling_processors().items()}


@pytest.mark.parametrize("case", CASES)
def test_tiles_equal_idefics3_and_smolvlm_processors(tiling_processors, case):
    """Idefics3's resizes (longest edge, then whole tiles), its split row by row and the whole
    image last, bit for bit; its padding mask all ones (every tile is whole)."""
    from mlxr.vision.tiles import tiled_pixel_values

    rgb = decode_image(encoded(*case), ImageLimits())
    for name, (hf, pre) in tiling_processors.items():
        want = hf([[rgb]], return_tensors="np", return_row_col_info=True)
        got = tiled_pixel_values(rgb, pre, max_tiles=1000)
        assert (got.rows, got.cols) == (want["rows"][0][0], want["cols"][0][0]), name
        assert len(got.pixels) == want["pixel_values"].shape[1], name
        assert want["pixel_attention_mask"].all(), name
        for ours, theirs in zip(got.pixels, want["pixel_values"][0]):
            assert ours.dtype == np.float32 and ours.shape == theirs.shape, name
            assert np.abs(ours - theirs).max() == 0.0, name


def test_tiles_beyond_the_limit_are_refused(tiling_processors):
    from mlxr.errors import InvalidParameterError
    from mlxr.vision.tiles import tiled_pixel_values

    _, pre = tiling_processors["idefics3-1456-364"]
    rgb = decode_image(encoded(1920, 1080, "RGB", "JPEG"), ImageLimits())
    assert len(tiled_pixel_values(rgb, pre, max_tiles=13).pixels) == 13  # 3 x 4 and the whole
    with pytest.raises(InvalidParameterError, match="MLXR_MAX_IMAGE_TILES"):
        tiled_pixel_values(rgb, pre, max_tiles=12)


def test_idefics3_config_bounds_the_tiles():
    from mlxr.errors import ModelFormatError

    with pytest.raises(ModelFormatError, match="tiles"):
        preprocess_from_hf({"size": {"longest_edge": 4096}, "max_image_size": {"longest_edge": 364}}, 364, tiled=True)
    with pytest.raises(ModelFormatError, match="image_size"):
        preprocess_from_hf({"max_image_size": {"longest_edge": 512}}, 364, tiled=True)
