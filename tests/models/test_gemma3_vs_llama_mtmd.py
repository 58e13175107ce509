"""Against llama.cpp's own multimodal path: `llama-mtmd-cli` (libmtmd, built from the llama.cpp
tree) on the GGUF + mmproj pair its converter wrote, and MLXR on the same files and the same
prompt ids (Gemma 3's turn with the image where libmtmd puts it): the same image token count,
prompt length and 24 greedy tokens. Images at the tower's own size (32 x 32), since libmtmd resizes
with its own bilinear filter and MLXR with Pillow's, as transformers does. Skipped without the
binary (MLXR_LLAMA_BIN names its folder)."""
from __future__ import annotations

import pytest
import torch
from image_fixtures import encoded, solid
from mtmd_setup import mtmd_setup

from mlxr import SamplingParams
from mlxr.testing.llama_mtmd import gemma3_mtmd_ids, printed_bytes, run_mtmd

pytestmark = pytest.mark.slow  # two llama-mtmd-cli runs and a model load: ~50 s on a shared host

QUESTION = "What is this?"
IMAGES = {"picture": encoded(32, 32, "RGB", "PNG", seed=3), "white": solid(32, 32, (255, 255, 255))}


@pytest.fixture(scope="module")
def setup():
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    return mtmd_setup(lambda root: llama_cpp_vlm("tiny-gemma3-vlm-swa", root))


def _ours(llm, image: bytes):
    ids = gemma3_mtmd_ids(llm.tokenizer, llm.args.vision, QUESTION, image)
    out = llm.generate([ids], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].outputs[0]
    return ids, out


def test_image_tokens_and_greedy_tokens_equal_llama_mtmd_cli(setup, tmp_path):
    exe, model, mmproj, llm = setup
    from mlxr.formats.gguf import open_gguf

    with open_gguf(model) as f:
        metadata = f.metadata
    replies = {}
    for name, image in IMAGES.items():
        path = tmp_path / f"{name}.png"
        path.write_bytes(image)
        theirs = run_mtmd(exe, model, mmproj, path, QUESTION, 24)
        ids, ours = _ours(llm, image)
        assert theirs.formatted == f"<start_of_turn>user\n<__media__>{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
        assert theirs.image_tokens == llm.args.vision.tokens_per_image == ids.images[0].length == 16
        assert theirs.prompt_tokens == len(ids)
        assert len(ours.token_ids) == 24
        assert theirs.generated == printed_bytes(metadata, ours.token_ids)  # its printout of our 24 tokens
        replies[name] = ours.token_ids
    assert replies["picture"] != replies["white"]  # the image decides the reply: the tower's output is used


def test_the_engine_reads_the_same_prompt_as_the_hf_processor_but_for_the_newlines(setup):
    """MLXR's own prompt for an image (transformers' full_image_sequence) holds two newlines on
    each side of the image that libmtmd's does not: the comparison above builds libmtmd's."""
    from mlxr import ImagePrompt
    from mlxr.vision.image_prompt import image_prompt_ids

    *_, llm = setup
    text = f"<bos><start_of_turn>user\n<start_of_image>{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
    hf_style = image_prompt_ids(ImagePrompt(text, (IMAGES["white"],), False), llm.args.vision, llm.tokenizer)
    ids = gemma3_mtmd_ids(llm.tokenizer, llm.args.vision, QUESTION, IMAGES["white"])
    newline = llm.tokenizer.encode("\n\n", add_special_tokens=False)
    assert len(hf_style) == len(ids) + 2 * len(newline)
    assert torch.equal(torch.tensor(hf_style.images[0].shape), torch.tensor(ids.images[0].shape))
