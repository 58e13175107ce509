"""Gemma 3 with images against transformers' Gemma3ForConditionalGeneration (fp32, eager) on a
tiny random checkpoint that transformers itself wrote: prompt logits with one and with two
images within ||d||/||ref|| <= 1e-4, and 24 greedy tokens identical. transformers builds its
bidirectional mask over each image's tokens from token_type_ids (its processor's output), so
the reference is given them; a check that the causal-only reference differs shows the
bidirectional spans are exercised."""
from __future__ import annotations

import io

import pytest
import torch

from image_fixtures import encoded, png
from model_fixtures import FIXTURES, cached_llm
from paged_probe import paged_image_logits, rel_err

from mlxr import ImagePrompt, SamplingParams

PROMPT = "<bos><start_of_turn>user\nLook: <start_of_image> then <start_of_image>, which?<end_of_turn>\n<start_of_turn>model\n"
ONE = "<bos><start_of_turn>user\nWhat is in <start_of_image> this picture?<end_of_turn>\n<start_of_turn>model\n"
TWO_IMAGES = (png(40, 30, 1), encoded(17, 50, "RGBA", "PNG", 2))


@pytest.fixture(scope="module")
def vlm():
    from transformers import Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-gemma3-vlm", FIXTURES)
    hf = Gemma3ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    return cached_llm(str(hf_dir)), hf, Gemma3ImageProcessorPil.from_pretrained(hf_dir)


def _inputs(llm, prompt: ImagePrompt):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(prompt, llm.engine.args.vision, llm.engine.tokenizer)


def _hf_pixels(processor, images: tuple[bytes, ...]) -> torch.Tensor:
    from PIL import Image

    return processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]


def _hf_kwargs(llm, processor, ids, images, bidirectional=True):
    t = torch.tensor([ids])
    kw = {"input_ids": t, "pixel_values": _hf_pixels(processor, images), "attention_mask": torch.ones_like(t)}
    if bidirectional:
        kw["token_type_ids"] = (t == llm.engine.args.vision.image_token_id).long()
    return kw


@pytest.mark.parametrize("text,images", [(ONE, TWO_IMAGES[:1]), (PROMPT, TWO_IMAGES)], ids=["one", "two"])
def test_prompt_logits_match_hf(vlm, text, images):
    llm, hf, processor = vlm
    prompt = _inputs(llm, ImagePrompt(text, images))
    ids, inputs = list(prompt), prompt.images
    assert [im.length for im in inputs] == [16] * len(images)
    ours = paged_image_logits(llm, ids, inputs)
    with torch.inference_mode():
        ref = hf(**_hf_kwargs(llm, processor, ids, images)).logits[0]
        causal = hf(**_hf_kwargs(llm, processor, ids, images, bidirectional=False)).logits[0]
    assert rel_err(ours, ref) <= 1e-4
    assert rel_err(ours, causal) > 1e-3  # the images' bidirectional spans matter here


@pytest.mark.parametrize("text,images", [(ONE, TWO_IMAGES[:1]), (PROMPT, TWO_IMAGES)], ids=["one", "two"])
def test_greedy_tokens_match_hf(vlm, text, images):
    llm, hf, processor = vlm
    ids = list(_inputs(llm, ImagePrompt(text, images)))
    with torch.inference_mode():
        want = hf.generate(**_hf_kwargs(llm, processor, ids, images), max_new_tokens=24, min_new_tokens=24,
                           do_sample=False)[0, len(ids):].tolist()
    got = llm.generate([ImagePrompt(text, images)], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    assert got[0].outputs[0].token_ids == want
    assert got[0].prompt_token_ids == ids  # the image tokens count in the prompt (usage, context)


def test_text_only_prompt_on_the_vlm_matches_hf(vlm):
    llm, hf, _ = vlm
    ids = [2, 7, 300, 45, 99, 12, 250, 3, 77, 180, 31, 64]
    with torch.inference_mode():
        want = hf.generate(input_ids=torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16,
                           do_sample=False)[0, len(ids):].tolist()
    got = llm.generate([ids], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert got[0].outputs[0].token_ids == want
