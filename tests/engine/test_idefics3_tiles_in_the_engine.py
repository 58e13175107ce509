"""Idefics3's tiles in the engine: each tile is an image to the scheduler and the prefix cache, so
a re-sent image runs none of its tiles through the tower again, and a prefill chunked below one
tile's tokens (a budget of 10 against 16) gives the unchunked run's tokens with every tile
encoded once."""
from __future__ import annotations

import pytest
import torch

from image_fixtures import png
from model_fixtures import FIXTURES

from mlxr import LLM, ImagePrompt, SamplingParams

TEXT = "User:<image>Describe it.<end_of_utterance>\nAssistant:"
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
TILES = 5  # a 120 x 100 image: 2 x 2 tiles and the whole one


@pytest.fixture(scope="module")
def vlm_dir():
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    return str(vlm_fixture_dir("tiny-idefics3", FIXTURES))


def _run(llm) -> list[int]:
    return llm.generate([ImagePrompt(TEXT, (png(120, 100, 1),))], GREEDY)[0].outputs[0].token_ids


def test_a_resent_image_encodes_no_tile_again(vlm_dir):
    llm = LLM(vlm_dir, dtype=torch.float32, block_size=4)
    try:
        first = _run(llm)
        assert llm.engine.stats().vision_encoder_calls == TILES
        assert _run(llm) == first
        assert llm.engine.stats().vision_encoder_calls == TILES  # every tile's blocks came from the cache
    finally:
        llm.shutdown()


def test_chunked_prefill_keeps_each_tile_whole(vlm_dir):
    whole = LLM(vlm_dir, dtype=torch.float32, enable_prefix_caching=False)
    try:
        want = _run(whole)
    finally:
        whole.shutdown()
    chunked = LLM(vlm_dir, dtype=torch.float32, enable_prefix_caching=False, max_num_batched_tokens=10)
    try:
        assert _run(chunked) == want
        assert chunked.engine.stats().vision_encoder_calls == TILES
    finally:
        chunked.shutdown()
