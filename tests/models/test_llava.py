"""LLaVA (CLIP tower read at its feature layer, MLP projector, Llama) against transformers'
LlavaForConditionalGeneration (fp32, eager) on a tiny random checkpoint transformers wrote:
prompt logits with one and with two images within ||d||/||ref|| <= 1e-4 and 24 greedy tokens
identical; the pixel values are its CLIP image processor's (shortest edge, centre crop)."""
from __future__ import annotations

import io

import pytest
import torch

from image_fixtures import encoded, png
from model_fixtures import FIXTURES, cached_llm
from paged_probe import assert_image_prompt_matches_hf

from mlxr import ImagePrompt

ONE = "USER: <image>\nWhat is in this picture? ASSISTANT:"
TWO = "USER: compare <image> with <image> please. ASSISTANT:"
IMAGES = (png(40, 30, 1), encoded(25, 60, "RGBA", "PNG", 2))


@pytest.fixture(scope="module")
def llava():
    from transformers import LlavaForConditionalGeneration
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-llava", FIXTURES)
    hf = LlavaForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    return cached_llm(str(hf_dir)), hf, CLIPImageProcessorPil.from_pretrained(hf_dir)


def _hf_inputs(processor, ids, images):
    from PIL import Image

    pixels = processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]
    t = torch.tensor([ids])
    return {"input_ids": t, "pixel_values": pixels, "attention_mask": torch.ones_like(t)}


def _ids(llm, text, images):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(ImagePrompt(text, images), llm.engine.args.vision, llm.engine.tokenizer)


@pytest.mark.parametrize("text,images", [(ONE, IMAGES[:1]), (TWO, IMAGES)], ids=["one", "two"])
def test_llava_logits_and_greedy_match_hf(llava, text, images):
    llm, hf, processor = llava
    prompt = _ids(llm, text, images)
    assert [im.length for im in prompt.images] == [16] * len(images)
    ids = list(prompt)
    assert_image_prompt_matches_hf(llm, hf, _hf_inputs(processor, ids, images), ids, prompt, text, images)
