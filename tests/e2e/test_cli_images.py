"""Images from the terminal and the Python API: `mlxr run` takes image paths in the message as
`ollama run` does, and LLM.chat takes PIL images, paths and bytes; both give the tokens of the
same prompt sent as an ImagePrompt."""
from __future__ import annotations

import pytest
import torch

from image_fixtures import png
from model_fixtures import FIXTURES, cached_llm
from test_cli import run

from mlxr import ImagePrompt, SamplingParams

GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
ONE_TURN = "<bos><start_of_turn>user\n<start_of_image>What is this?<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def vlm_dir():
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    return str(vlm_fixture_dir("tiny-gemma3-vlm", FIXTURES))


def test_llm_chat_takes_pil_images_paths_and_bytes(vlm_dir, tmp_path):
    from PIL import Image
    import io

    llm = cached_llm(vlm_dir)
    data = png(40, 30, 1)
    want = llm.generate([ImagePrompt(ONE_TURN, (data,), False)], GREEDY)[0].outputs[0].token_ids
    path = tmp_path / "cat.png"
    path.write_bytes(data)
    for image in (Image.open(io.BytesIO(data)), str(path), data):
        parts = [{"type": "image", "image": image}, {"type": "text", "text": "What is this?"}]
        got = llm.chat([{"role": "user", "content": parts}], GREEDY)
        assert got.outputs[0].token_ids == want


def test_mlxr_run_attaches_image_paths(vlm_dir, tmp_path):
    path = tmp_path / "cat.png"
    path.write_bytes(png(40, 30, 1))
    llm = cached_llm(vlm_dir)
    want = llm.generate([ImagePrompt(ONE_TURN, (path.read_bytes(),), False)],
                        SamplingParams(max_tokens=5, temperature=0))[0].outputs[0].text
    res = run(["run", vlm_dir, "--max-tokens", "5", "--temperature", "0", "--dtype", "float32"],
              input=f"What is this? {path}\n/bye\n")
    assert res.returncode == 0, res.stderr
    assert f"Added image '{path}'" in res.stderr
    assert want in res.stdout
