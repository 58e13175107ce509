"""Qwen2.5-VL (window-attention tower with 2D rotary, 2 x 2 merger, Qwen2 with M-RoPE) against
transformers' Qwen2_5_VLForConditionalGeneration (fp32, eager) on a tiny random checkpoint
transformers wrote: prompt logits with one and with two images of different sizes within
||d||/||ref|| <= 1e-4 and 24 greedy tokens identical through the engine (decode positions carry
the rope delta); the pixel values are its Qwen2-VL image processor's (smart resize)."""
from __future__ import annotations

import io

import pytest
import torch

from image_fixtures import encoded, png
from model_fixtures import FIXTURES, cached_llm
from paged_probe import assert_image_prompt_matches_hf

from mlxr import ImagePrompt

MARK = "<|vision_start|><|image_pad|><|vision_end|>"
ONE = f"<|im_start|>user\n{MARK}What is in this picture?<|im_end|>\n<|im_start|>assistant\n"
TWO = f"<|im_start|>user\ncompare {MARK} with {MARK} please.<|im_end|>\n<|im_start|>assistant\n"
IMAGES = (png(40, 30, 1), encoded(25, 70, "RGBA", "PNG", 2))


@pytest.fixture(scope="module")
def qwen():
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-qwen25-vl", FIXTURES)
    hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    return cached_llm(str(hf_dir)), hf, Qwen2VLImageProcessorPil.from_pretrained(hf_dir)


def _hf_inputs(processor, ids, images):
    from PIL import Image

    out = processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")
    t = torch.tensor([ids])
    return {"input_ids": t, "pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
            "attention_mask": torch.ones_like(t), "mm_token_type_ids": (t == 5).int()}


def _ids(llm, text, images):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(ImagePrompt(text, images), llm.engine.args.vision, llm.engine.tokenizer)


@pytest.mark.parametrize("text,images", [(ONE, IMAGES[:1]), (TWO, IMAGES)], ids=["one", "two"])
def test_qwen25_vl_logits_and_greedy_match_hf(qwen, text, images):
    llm, hf, processor = qwen
    prompt = _ids(llm, text, images)
    ids = list(prompt)
    inputs = _hf_inputs(processor, ids, images)
    grids = inputs["image_grid_thw"].tolist()
    assert [im.length for im in prompt.images] == [t * h * w // 4 for t, h, w in grids]
    assert len({im.length for im in prompt.images}) == len(images)  # the two differ in size
    assert_image_prompt_matches_hf(llm, hf, inputs, ids, prompt, text, images)


def test_qwen25_vl_show_says_vision(qwen):
    from mlxr.server.ollama.model_info import capabilities, vision_info
    from mlxr.testing.vlm_fixtures import QWEN25_VL_PIXELS

    args = qwen[0].engine.args
    assert "vision" in capabilities("", args)
    info = vision_info("qwen2_5_vl", args.vision)
    assert info["mlxr.vision.max_tokens_per_image"] == QWEN25_VL_PIXELS[1] // 64
    assert info["qwen2_5_vl.vision.block_count"] == 3
