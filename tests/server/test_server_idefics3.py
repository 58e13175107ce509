"""An Idefics3 HF directory served by a real `mlxr serve`: /api/show and /v1/models say `vision`,
and /api/show gives the tokens of one tile and the most tiles (an image's count varies with its
tiles); an Ollama
`images` request on /api/generate (raw) counts the tiles' tokens as transformers' processor lays
them out and answers what transformers' greedy decoding of the same prompt gives."""
from __future__ import annotations

import httpx
import ollama
import pytest
import torch

from image_fixtures import png
from model_fixtures import FIXTURES
from server_harness import running_server

PROMPT = "What is this?"


@pytest.fixture(scope="module")
def hf_dir():
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    return vlm_fixture_dir("tiny-idefics3", FIXTURES)


@pytest.fixture(scope="module")
def served(tmp_path_factory, hf_dir):
    with running_server(tmp_path_factory.mktemp("idefics3-home"), "--model", str(hf_dir)) as url:
        yield url, httpx.get(url + "/api/tags").json()["models"][0]["name"]


def test_show_says_vision_and_the_tiles(served):
    url, model = served
    shown = ollama.Client(url).show(model)
    assert "vision" in shown.capabilities
    info = shown.modelinfo
    assert info["mlxr.vision.tokens_per_tile"] == 16 and info["mlxr.vision.max_tiles"] == 5  # 2 x 2 and the whole
    assert "mlxr.vision.tokens_per_image" not in info
    assert httpx.get(url + f"/v1/models/{model}").json()["capabilities"] == ["completion", "vision"]


def test_generate_with_an_image_matches_hf(served, hf_dir):
    from transformers import AutoTokenizer, Idefics3ForConditionalGeneration
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    from mlxr.vision.decode import decode_image
    from mlxr.vision.limits import ImageLimits

    url, model = served
    image = png(120, 100, 1)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    processor = Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(hf_dir), tok, image_seq_len=16)
    inputs = processor(text=["<image>" + PROMPT], images=[[decode_image(image, ImageLimits())]], return_tensors="pt")
    hf = Idefics3ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        out = hf.eval().generate(**inputs, max_new_tokens=8, do_sample=False)[0, inputs["input_ids"].shape[1]:]
    reply = ollama.Client(url).generate(model=model, prompt=PROMPT, images=[image], raw=True,
                                        options={"num_predict": 8, "temperature": 0})
    assert reply.prompt_eval_count == inputs["input_ids"].shape[1]  # 5 tiles of 16 and the layout's tokens
    assert len(out) == 8 and reply.eval_count == 8  # no early stop: eight tokens compared
    assert reply.response == tok.decode(out.tolist(), skip_special_tokens=True)
