"""Idefics3 and SmolVLM from the Llama GGUF and the mmproj GGUF that llama.cpp's converter writes
(`convert_hf_to_gguf.py` and `--mmproj`, projector type `idefics3`) against transformers'
Idefics3ForConditionalGeneration / SmolVLMForConditionalGeneration (fp32, eager) on the
checkpoints they were converted from: the mmproj's tower, pixel shuffle and tiling
(`clip.vision.preproc_image_size`), the prompt ids transformers' processor writes, prompt logits
with one and with two images within ||d||/||ref|| <= 1e-4 and 24 greedy tokens identical."""
from __future__ import annotations

import pytest
import torch

from image_fixtures import encoded, png
from model_fixtures import FIXTURES, cached_llm
from paged_probe import assert_image_prompt_matches_hf

from mlxr import ImagePrompt

ONE = "User:<image>What is in this picture?<end_of_utterance>\nAssistant:"
TWO = "User: compare <image> with <image> please.<end_of_utterance>\nAssistant:"
IMAGES = (png(120, 100, 1), encoded(30, 90, "RGBA", "PNG", 2))
CASES = pytest.mark.parametrize("text,images", [(ONE, IMAGES[:1]), (TWO, IMAGES)], ids=["one", "two"])
CLASSES = {"tiny-idefics3": ("Idefics3ForConditionalGeneration", "idefics3", "Idefics3"),
           "tiny-smolvlm": ("SmolVLMForConditionalGeneration", "smolvlm", "SmolVLM")}


@pytest.fixture(scope="module", params=list(CLASSES))
def vlm(request):
    import importlib

    import transformers
    from transformers import AutoTokenizer
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    try:
        gguf, mmproj = llama_cpp_vlm(request.param, FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))
    cls, module, prefix = CLASSES[request.param]
    hf_dir = vlm_fixture_dir(request.param, FIXTURES)
    hf = getattr(transformers, cls).from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    pil = importlib.import_module(f"transformers.models.{module}.image_processing_pil_{module}")
    side = hf.config.vision_config.image_size // hf.config.vision_config.patch_size // hf.config.scale_factor
    # SmolVLMProcessor writes the same text for images (and needs num2words, absent here)
    processor = Idefics3Processor(getattr(pil, f"{prefix}ImageProcessorPil").from_pretrained(hf_dir),
                                  AutoTokenizer.from_pretrained(hf_dir), image_seq_len=side * side)
    return cached_llm(str(gguf), mmproj=str(mmproj)), hf, processor


def _hf_inputs(processor, text, images):
    from mlxr.vision.decode import decode_image
    from mlxr.vision.limits import ImageLimits

    return processor(text=[text], images=[[decode_image(b, ImageLimits()) for b in images]], return_tensors="pt")


def _prompt(llm, text, images):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(ImagePrompt(text, images), llm.engine.args.vision, llm.engine.tokenizer)


def test_the_mmproj_gives_the_towers_shape_and_tiles(vlm):
    llm, hf, processor = vlm
    v, ip = llm.engine.args.vision, processor.image_processor
    assert (v.tower, v.projector, v.scale_factor, v.tokens_per_image) == (
        "idefics3", "idefics3", hf.config.scale_factor, processor.image_seq_len)
    assert v.image_token_id == hf.config.image_token_id
    assert (v.preprocess.tiling.longest_edge, v.preprocess.tiling.tile) == (
        ip.size["longest_edge"], ip.max_image_size["longest_edge"])
    assert (v.hidden_size, v.num_hidden_layers, v.image_size, v.patch_size) == (32, 2, 64, 8)


@CASES
def test_prompt_logits_and_greedy_match_hf(vlm, text, images):
    llm, hf, processor = vlm
    prompt = _prompt(llm, text, images)
    inputs = _hf_inputs(processor, text, images)
    ids = list(prompt)
    assert ids == inputs["input_ids"][0].tolist()
    assert_image_prompt_matches_hf(llm, hf, inputs, ids, prompt, text, images)


BAD = {
    "tiles": ({"clip.vision.preproc_image_size": 4096}, "preproc_image_size 4096 makes more than 8 tiles of 64"),
    "shuffle": ({"clip.vision.projector.scale_factor": 3}, "not a whole number of 8-pixel patches merged 3 a side"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_idefics3_mmproj_is_refused_with_the_reason(tmp_path, case):
    import re

    from mmproj_files import rewrite

    from mlxr.errors import ModelFormatError
    from mlxr.registry import Registry
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    model, mmproj = llama_cpp_vlm("tiny-idefics3", FIXTURES)
    metadata, reason = BAD[case]
    bad = rewrite(mmproj, tmp_path / "bad-mmproj.gguf", metadata)
    registry = Registry(tmp_path / "home")
    with pytest.raises(ModelFormatError, match=re.escape(reason)):
        registry.import_model(model, "vlm", projector=bad)
    registry.import_model(model, "vlm", projector=mmproj)  # the file as the converter wrote it
    assert [r.name for r in registry.list()] == ["vlm:latest"]
