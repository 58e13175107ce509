"""Gemma 3 with images from the GGUF and the mmproj GGUF that llama.cpp's converter writes
(`convert_hf_to_gguf.py` and `--mmproj`) against transformers' Gemma3ForConditionalGeneration
(fp32, eager) on the checkpoint they were converted from: prompt logits with one and with two
images within ||d||/||ref|| <= 1e-4 and 24 greedy tokens identical. The converter stores the
projector's matrix in F16 (llama.cpp forces it), so the reference holds that matrix rounded to
F16 too: the same numbers as the file."""
from __future__ import annotations

import io

import pytest
import torch

from image_fixtures import encoded, png
from model_fixtures import FIXTURES, cached_llm
from paged_probe import paged_image_logits, rel_err

from mlxr import ImagePrompt, SamplingParams

ONE = "<bos><start_of_turn>user\nWhat is in <start_of_image> this picture?<end_of_turn>\n<start_of_turn>model\n"
TWO = "<bos><start_of_turn>user\nLook: <start_of_image> then <start_of_image>, which?<end_of_turn>\n<start_of_turn>model\n"
IMAGES = (png(40, 30, 1), encoded(17, 50, "RGBA", "PNG", 2))
CASES = pytest.mark.parametrize("text,images", [(ONE, IMAGES[:1]), (TWO, IMAGES)], ids=["one", "two"])


@pytest.fixture(scope="module")
def files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    try:
        return llama_cpp_vlm("tiny-gemma3-vlm-swa", FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def vlm(files):
    from transformers import Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-gemma3-vlm-swa", FIXTURES)
    hf = Gemma3ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        w = hf.model.multi_modal_projector.mm_input_projection_weight
        w.copy_(w.half().float())
    gguf, mmproj = files
    return cached_llm(str(gguf), mmproj=str(mmproj)), hf, Gemma3ImageProcessorPil.from_pretrained(hf_dir)


def _reference_inputs(llm, processor, ids, images):
    from PIL import Image

    t = torch.tensor([ids])
    pixels = processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]
    return {"input_ids": t, "pixel_values": pixels, "attention_mask": torch.ones_like(t),
            "token_type_ids": (t == llm.engine.args.vision.image_token_id).long()}


def _prompt(llm, text, images):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(ImagePrompt(text, images), llm.engine.args.vision, llm.engine.tokenizer)


def test_the_mmproj_gives_the_towers_shape_and_image_tokens(vlm):
    llm, hf, _ = vlm
    v = llm.engine.args.vision
    assert (v.tower, v.projector, v.tokens_per_image) == ("siglip", "gemma3", hf.config.mm_tokens_per_image)
    assert v.image_token_id == hf.config.image_token_index
    assert (v.hidden_size, v.num_hidden_layers, v.image_size, v.patch_size) == (32, 2, 32, 4)


@CASES
def test_prompt_logits_match_hf(vlm, text, images):
    llm, hf, processor = vlm
    prompt = _prompt(llm, text, images)
    ids = list(prompt)
    assert [im.length for im in prompt.images] == [16] * len(images)
    ours = paged_image_logits(llm, ids, prompt.images)
    with torch.inference_mode():
        ref = hf(**_reference_inputs(llm, processor, ids, images)).logits[0]
    assert rel_err(ours, ref) <= 1e-4


@CASES
def test_greedy_tokens_match_hf(vlm, text, images):
    llm, hf, processor = vlm
    ids = list(_prompt(llm, text, images))
    with torch.inference_mode():
        want = hf.generate(**_reference_inputs(llm, processor, ids, images), max_new_tokens=24, min_new_tokens=24,
                           do_sample=False)[0, len(ids):].tolist()
    got = llm.generate([ImagePrompt(text, images)], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert got[0].outputs[0].token_ids == want
