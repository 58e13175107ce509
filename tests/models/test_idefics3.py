"""Idefics3 and SmolVLM (SigLIP tower with bucketed positions on each tile, pixel-shuffle
connector, Llama) against transformers' Idefics3ForConditionalGeneration and
SmolVLMForConditionalGeneration (fp32, eager) on tiny random checkpoints transformers wrote:
the prompt ids its processor writes (tiles, row/col tokens, the global image), prompt logits with
one and with two images within ||d||/||ref|| <= 1e-4, and 24 greedy tokens identical. The prompt's
layout is Idefics3Processor's for both (SmolVLMProcessor writes the same text for images, and
needs num2words, which the test environment lacks). The images split into 2 x 2 tiles and the
whole one, or 2 x 1 and the whole one; with `do_image_splitting: false` each is the whole one."""
from __future__ import annotations

import pytest
import torch

from image_fixtures import encoded, png
from model_fixtures import FIXTURES, cached_llm
from paged_probe import assert_image_prompt_matches_hf, paged_image_logits, rel_err

from mlxr import ImagePrompt

ONE = "User:<image>What is in this picture?<end_of_utterance>\nAssistant:"
TWO = "User: compare <image> with <image> please.<end_of_utterance>\nAssistant:"
IMAGES = (png(120, 100, 1), encoded(30, 90, "RGBA", "PNG", 2), png(40, 40, 3))
CASES = [(ONE, IMAGES[:1]), (TWO, IMAGES[1:]), (TWO, IMAGES[:2])]
CLASSES = {"tiny-idefics3": ("Idefics3ForConditionalGeneration", "idefics3"),
           "tiny-smolvlm": ("SmolVLMForConditionalGeneration", "smolvlm")}


@pytest.fixture(scope="module", params=list(CLASSES))
def vlm(request):
    import importlib

    import transformers
    from transformers import AutoTokenizer
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    cls, module = CLASSES[request.param]
    hf_dir = vlm_fixture_dir(request.param, FIXTURES)
    hf = getattr(transformers, cls).from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    pil = importlib.import_module(f"transformers.models.{module}.image_processing_pil_{module}")
    image_processor = getattr(pil, f"{cls.removesuffix('ForConditionalGeneration')}ImageProcessorPil").from_pretrained(hf_dir)
    side = hf.config.vision_config.image_size // hf.config.vision_config.patch_size // hf.config.scale_factor
    processor = Idefics3Processor(image_processor, AutoTokenizer.from_pretrained(hf_dir), image_seq_len=side * side)
    return cached_llm(str(hf_dir)), hf, processor


def _hf_inputs(processor, text, images):
    from mlxr.vision.decode import decode_image
    from mlxr.vision.limits import ImageLimits

    rgb = [decode_image(b, ImageLimits()) for b in images]  # the RGB image ours decodes (alpha on white)
    return processor(text=[text], images=[rgb], return_tensors="pt")


def _ids(llm, text, images):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(ImagePrompt(text, images), llm.engine.args.vision, llm.engine.tokenizer)


@pytest.mark.parametrize("text,images", CASES, ids=["one", "two-small", "two"])
def test_idefics3_logits_and_greedy_match_hf(vlm, text, images):
    llm, hf, processor = vlm
    prompt = _ids(llm, text, images)
    inputs = _hf_inputs(processor, text, images)
    ids = list(prompt)
    assert ids == inputs["input_ids"][0].tolist()
    assert len(prompt.images) == inputs["pixel_values"].shape[1]
    assert_image_prompt_matches_hf(llm, hf, inputs, ids, prompt, text, images)


def test_unsplit_images_match_hf(vlm, tmp_path):
    """The same checkpoint with `do_image_splitting: false`: each image one tile, its layout
    `<fake_token_around_image><global-img>` and the run, closed by `<fake_token_around_image>`."""
    import json
    import shutil

    from transformers import AutoTokenizer
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    _, hf, processor = vlm
    hf_dir = tmp_path / "unsplit"
    shutil.copytree(hf.name_or_path, hf_dir)
    pre = json.loads((hf_dir / "preprocessor_config.json").read_text())
    (hf_dir / "preprocessor_config.json").write_text(json.dumps({**pre, "do_image_splitting": False}))
    image_processor = type(processor.image_processor).from_pretrained(hf_dir)
    unsplit = Idefics3Processor(image_processor, AutoTokenizer.from_pretrained(hf_dir),
                                image_seq_len=processor.image_seq_len)
    llm = cached_llm(str(hf_dir))
    prompt = _ids(llm, TWO, IMAGES[:2])
    inputs = _hf_inputs(unsplit, TWO, IMAGES[:2])
    assert list(prompt) == inputs["input_ids"][0].tolist() and len(prompt.images) == 2
    with torch.inference_mode():
        ref = hf(**inputs).logits[0]
    assert rel_err(paged_image_logits(llm, list(prompt), prompt.images), ref) <= 1e-4
