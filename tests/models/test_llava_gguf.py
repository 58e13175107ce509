"""LLaVA from the Llama GGUF llama.cpp's convert_hf_to_gguf.py writes and the LLaVA-1.5 mmproj
(projector type `mlp`) its legacy convert_image_encoder_to_gguf.py writes, against transformers'
LlavaForConditionalGeneration (fp32, eager) on the checkpoint they came from: prompt logits with
one and with two images within ||d||/||ref|| <= 1e-4 and 24 greedy tokens identical. The script
stores the patch convolution and the projector's matrices in F16 whatever it is asked, so the
reference holds those rounded to F16 too: the same numbers as the file."""
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
CASES = pytest.mark.parametrize("text,images", [(ONE, IMAGES[:1]), (TWO, IMAGES)], ids=["one", "two"])


@pytest.fixture(scope="module")
def files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.llava_mmproj_fixtures import llama_cpp_llava

    try:
        return llama_cpp_llava(FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def llava(files):
    from transformers import LlavaForConditionalGeneration
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-llava", FIXTURES)
    hf = LlavaForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        proj = hf.model.multi_modal_projector
        for w in (hf.model.vision_tower.embeddings.patch_embedding.weight, proj.linear_1.weight, proj.linear_2.weight):
            w.copy_(w.half().float())
    gguf, mmproj = files
    return cached_llm(str(gguf), mmproj=str(mmproj)), hf, CLIPImageProcessorPil.from_pretrained(hf_dir)


def _hf_inputs(processor, ids, images):
    from PIL import Image

    pixels = processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")["pixel_values"]
    t = torch.tensor([ids])
    return {"input_ids": t, "pixel_values": pixels, "attention_mask": torch.ones_like(t)}


def _prompt(llm, text, images):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(ImagePrompt(text, images), llm.engine.args.vision, llm.engine.tokenizer)


def test_the_mmproj_gives_the_clip_tower_and_its_feature_layer(llava):
    llm, hf, _ = llava
    v = llm.engine.args.vision
    assert (v.tower, v.projector, v.tokens_per_image, v.hidden_act) == ("clip", "llava", 16, "quick_gelu")
    assert v.image_token_id == hf.config.image_token_index
    # the script keeps the blocks up to the feature layer (-2 of 3): two, read at the second
    assert (v.num_hidden_layers, v.feature_layer, v.hidden_size, v.image_size, v.patch_size) == (2, 2, 32, 32, 8)


@CASES
def test_llava_gguf_logits_and_greedy_match_hf(llava, text, images):
    llm, hf, processor = llava
    prompt = _prompt(llm, text, images)
    assert [im.length for im in prompt.images] == [16] * len(images)
    ids = list(prompt)
    assert_image_prompt_matches_hf(llm, hf, _hf_inputs(processor, ids, images), ids, prompt, text, images)
