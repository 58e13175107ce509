"""Qwen2.5-VL against llama.cpp's own multimodal path: `llama-mtmd-cli` (libmtmd) on the qwen2vl
GGUF and the qwen2.5vl_merger mmproj its converter wrote, and MLXR on the same files and the same
prompt ids (libmtmd's formatted prompt, the image's tokens between `<|vision_start|>` and
`<|vision_end|>` where its marker stands): the same image token count and prompt length, and the
same 24 greedy tokens. Images whose sides are already multiples of 8 pixels and whose area lies
within both sides' pixel bounds (libmtmd keeps 8..4096 tokens, MLXR transformers' 56 x 56 ..
28 x 28 x 1280 pixels), so neither resizes them. Skipped without the binary (MLXR_LLAMA_BIN)."""
from __future__ import annotations

import pytest
from image_fixtures import encoded, solid
from mtmd_setup import mtmd_setup

from mlxr import SamplingParams
from mlxr.testing.llama_mtmd import printed_bytes, qwen25_vl_mtmd_ids, run_mtmd

pytestmark = pytest.mark.slow  # two llama-mtmd-cli runs and a model load

QUESTION = "What is this?"
# the picture spans 2 x 2 of the 112-pixel windows (16 x 15 tokens), the white one fits in one
IMAGES = {"picture": encoded(128, 120, "RGB", "PNG", seed=3), "white": solid(64, 56, (255, 255, 255))}
TOKENS = {"picture": 16 * 15, "white": 8 * 7}


@pytest.fixture(scope="module")
def setup():
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    return mtmd_setup(lambda root: llama_cpp_vlm("tiny-qwen25-vl", root))


def test_qwen25_vl_image_tokens_and_greedy_tokens_equal_llama_mtmd_cli(setup, tmp_path):
    exe, model, mmproj, llm = setup
    from mlxr.formats.gguf import open_gguf

    with open_gguf(model) as f:
        metadata = f.metadata
    replies = {}
    for name, image in IMAGES.items():
        path = tmp_path / f"{name}.png"
        path.write_bytes(image)
        theirs = run_mtmd(exe, model, mmproj, path, QUESTION, 24, threads=1, extra=("--jinja",))
        ids = qwen25_vl_mtmd_ids(llm.tokenizer, llm.args.vision, theirs.formatted, image)
        ours = llm.generate([ids], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].outputs[0]
        assert theirs.image_tokens == ids.images[0].length == TOKENS[name]
        assert theirs.prompt_tokens == len(ids)
        assert theirs.generated == printed_bytes(metadata, ours.token_ids).strip(b"\n")
        replies[name] = theirs.generated
    assert replies["picture"] != replies["white"]  # the image decides its reply: the tower's output is used
