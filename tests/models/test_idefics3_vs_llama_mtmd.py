"""Idefics3 against llama.cpp's own multimodal path: `llama-mtmd-cli` (libmtmd) on the Llama GGUF
+ idefics3 mmproj pair its converter wrote, and MLXR on the same files with the prompt
llama-mtmd-cli renders (the fixture's chat template, `--jinja`) and the image where it puts it:
the same tiles (each 16 tokens), prompt length (the tile layout's tokens included) and 24 greedy
tokens, byte for byte as it prints them, for a square picture, a wide one (2 x 1 tiles) and a
solid colour; and the images give different replies. libmtmd resizes with its own filter, MLXR
with Pillow's LANCZOS as transformers does: the equal tokens are measured on these images, not
implied by equal pixels. Skipped without the binary (MLXR_LLAMA_BIN names its folder)."""
from __future__ import annotations

import pytest
from image_fixtures import encoded, solid
from mtmd_setup import mtmd_setup

from mlxr import ImagePrompt, SamplingParams
from mlxr.testing.llama_mtmd import printed_bytes, run_mtmd

pytestmark = pytest.mark.slow  # three llama-mtmd-cli runs and a model load

QUESTION = "What is this?"
RENDERED = "<|user|>\n{image}" + QUESTION + "</s>\n<|assistant|>\n"  # the fixture's zephyr template
IMAGES = {"picture": (encoded(128, 128, "RGB", "PNG", 3), 5), "wide": (encoded(200, 90, "RGB", "PNG", 4), 3),
          "solid": (solid(128, 128, (200, 30, 90)), 5)}


@pytest.fixture(scope="module")
def setup():
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    return mtmd_setup(lambda root: llama_cpp_vlm("tiny-idefics3", root))


def test_tiles_prompt_and_greedy_tokens_equal_llama_mtmd_cli(setup, tmp_path):
    from mlxr.formats.gguf import open_gguf
    from mlxr.vision.image_prompt import image_prompt_ids

    exe, model, mmproj, llm = setup
    with open_gguf(model) as f:
        metadata = f.metadata
    replies = {}
    for name, (image, tiles) in IMAGES.items():
        path = tmp_path / f"{name}.png"
        path.write_bytes(image)
        theirs = run_mtmd(exe, model, mmproj, path, QUESTION, 24, extra=("--jinja",))
        ids = image_prompt_ids(ImagePrompt(RENDERED.format(image="<image>"), (image,)), llm.args.vision, llm.tokenizer)
        ours = llm.generate([ids], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].outputs[0]
        assert theirs.formatted == RENDERED.format(image="<__media__>")
        assert list(theirs.image_batches) == [im.length for im in ids.images] == [16] * tiles
        assert theirs.prompt_tokens == len(ids)
        assert len(ours.token_ids) == 24
        assert theirs.generated == printed_bytes(metadata, ours.token_ids), name
        replies[name] = ours.token_ids
    assert len({tuple(r) for r in replies.values()}) == 3  # the image decides the reply
