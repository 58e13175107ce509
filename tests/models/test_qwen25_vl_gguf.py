"""Qwen2.5-VL from the GGUF (arch `qwen2vl`, M-RoPE sections in rope.dimension_sections) and the
mmproj (`qwen2.5vl_merger`) that llama.cpp's converter writes, against transformers'
Qwen2_5_VLForConditionalGeneration (fp32, eager) on the checkpoint they were converted from:
prompt logits with one and with two images of different sizes within ||d||/||ref|| <= 1e-4 and
24 greedy tokens identical from F32 files (nothing rounded); from F16 ones, prompt logits with
two images against the reference with its matrices rounded to F16 as the files hold them. The
mmproj keeps neither the tower's window size nor the processor's pixel bounds, so both sides use
what llama.cpp and transformers fall back to: windows of 112 pixels (the reference's window set to it; the big
image spans 2 x 2 windows, ragged) and the image processor's default 56 x 56 .. 28 x 28 x 1280
pixels (the small image is enlarged to reach the least)."""
from __future__ import annotations

import copy
import io

import pytest
import torch

from image_fixtures import encoded, png
from model_fixtures import FIXTURES, cached_llm
from paged_probe import assert_image_prompt_matches_hf, paged_image_logits, rel_err

from mlxr import ImagePrompt

MARK = "<|vision_start|><|image_pad|><|vision_end|>"
ONE = f"<|im_start|>user\n{MARK}What is in this picture?<|im_end|>\n<|im_start|>assistant\n"
TWO = f"<|im_start|>user\ncompare {MARK} with {MARK} please.<|im_end|>\n<|im_start|>assistant\n"
IMAGES = (png(150, 120, 1), encoded(40, 70, "RGBA", "PNG", 2))
DEFAULT_BLOCKS = 112 // 8  # llama.cpp's window side in 2 x 2 blocks of 4-pixel patches
CASES = pytest.mark.parametrize("text,images", [(ONE, IMAGES[:1]), (TWO, IMAGES)], ids=["one", "two"])


@pytest.fixture(scope="module")
def files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    try:
        return llama_cpp_vlm("tiny-qwen25-vl", FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def qwen(files):
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from mlxr.formats.mmproj_qwen import DEFAULT_WINDOW
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-qwen25-vl", FIXTURES)
    hf = Qwen2_5_VLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    hf.model.visual.window_size = DEFAULT_WINDOW
    gguf, mmproj = files
    processor = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2)  # default pixel bounds
    return cached_llm(str(gguf), mmproj=str(mmproj)), hf, processor


def _hf_inputs(llm, processor, ids, images):
    from PIL import Image

    out = processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")
    t = torch.tensor([ids])
    image = (t == llm.engine.args.vision.image_token_id).int()
    return {"input_ids": t, "pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
            "attention_mask": torch.ones_like(t), "mm_token_type_ids": image}


def _ids(llm, text, images):
    from mlxr.vision.image_prompt import image_prompt_ids

    return image_prompt_ids(ImagePrompt(text, images), llm.engine.args.vision, llm.engine.tokenizer)


def test_the_files_give_the_tower_and_the_text_models_mrope(qwen):
    llm, hf, _ = qwen
    v, vc = llm.engine.args.vision, hf.config.vision_config
    assert (v.tower, v.projector, v.image_token_id) == ("qwen2_5_vl", "qwen2_5_vl", hf.config.image_token_id)
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.patch_size) == \
        (vc.hidden_size, vc.depth, vc.num_heads, vc.patch_size)
    assert (v.scale_factor, v.temporal_patch_size) == (vc.spatial_merge_size, vc.temporal_patch_size)
    assert v.full_attention_layers == tuple(vc.fullatt_block_indexes)  # from clip.vision.n_wa_pattern
    assert list(v.mrope_section) == hf.config.text_config.rope_parameters["mrope_section"]


@CASES
def test_qwen25_vl_gguf_logits_and_greedy_match_hf(qwen, text, images):
    llm, hf, processor = qwen
    prompt = _ids(llm, text, images)
    ids = list(prompt)
    inputs = _hf_inputs(llm, processor, ids, images)
    grids = inputs["image_grid_thw"].tolist()
    assert [im.length for im in prompt.images] == [t * h * w // 4 for t, h, w in grids]
    assert len({im.length for im in prompt.images}) == len(images)  # the two differ in size
    assert max(h for _, h, _ in grids) // 2 > DEFAULT_BLOCKS  # the big one spans more than one window
    assert_image_prompt_matches_hf(llm, hf, inputs, ids, prompt, text, images)



def test_the_pair_reports_vision_and_the_text_gguf_alone_is_refused(qwen, files):
    from mlxr import LLM
    from mlxr.errors import UnsupportedModelError
    from mlxr.formats.mmproj_qwen import MAX_PIXELS
    from mlxr.server.ollama.model_info import capabilities, vision_info

    args = qwen[0].engine.args
    assert "vision" in capabilities("", args)
    assert vision_info("qwen2_5_vl", args.vision)["mlxr.vision.max_tokens_per_image"] == MAX_PIXELS // 64
    with pytest.raises(UnsupportedModelError, match="give its mmproj file"):
        LLM(str(files[0]))


def test_f16_files_match_hf_with_the_same_rounding(qwen):
    """--outtype f16: the converter stores every matrix (and the patch kernels) in F16, norms and
    biases in F32; the reference holds its matrices rounded the same way."""
    from mlxr.formats.gguf import open_gguf
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    _, hf, processor = qwen
    gguf, mmproj = llama_cpp_vlm("tiny-qwen25-vl", FIXTURES, outtype="f16")
    for path in (gguf, mmproj):
        with open_gguf(path) as f:
            infos = [f.tensor_info(n) for n in f.tensor_names]
        assert {i.ggml_type for i in infos if len(i.shape) >= 2} == {"F16"}
        assert {i.ggml_type for i in infos if len(i.shape) == 1} == {"F32"}
    rounded = copy.deepcopy(hf)
    with torch.no_grad():
        for p in rounded.parameters():
            if p.ndim >= 2:
                p.copy_(p.half().float())
    llm = cached_llm(str(gguf), mmproj=str(mmproj))
    text, images = TWO, IMAGES
    prompt = _ids(llm, text, images)
    ids = list(prompt)
    inputs = _hf_inputs(llm, processor, ids, images)
    ours = paged_image_logits(llm, ids, prompt.images)
    with torch.inference_mode():
        ref = rounded(**inputs).logits[0]
        unrounded = hf(**inputs).logits[0]
    assert rel_err(ours, ref) <= 1e-4 < rel_err(ours, unrounded)
