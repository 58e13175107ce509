"""Images in the engine: the prefix cache keys an image's blocks by the image's bytes (the same
image re-sent runs no tower and hits the cache; another image behind the same placeholder ids
does not), and a prefill chunked below an image's length never splits it (the tower runs once
and the tokens are those of the unchunked run)."""
from __future__ import annotations

import pytest
import torch

from image_fixtures import png, solid
from model_fixtures import FIXTURES

from mlxr import LLM, ImagePrompt, SamplingParams

TEXT = "<bos><start_of_turn>user\nDescribe <start_of_image> in a few words please.<end_of_turn>\n<start_of_turn>model\n"
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def vlm_dir():
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    return str(vlm_fixture_dir("tiny-gemma3-vlm", FIXTURES))


def _run(llm, image: bytes, text: str = TEXT) -> list[int]:
    return llm.generate([ImagePrompt(text, (image,))], GREEDY)[0].outputs[0].token_ids


def test_same_image_resent_hits_the_cache_and_encodes_nothing(vlm_dir):
    llm = LLM(vlm_dir, dtype=torch.float32, block_size=4)
    try:
        first = _run(llm, png(40, 30, 1))
        s1 = llm.engine.stats()
        assert s1.vision_encoder_calls == 1
        again = _run(llm, png(40, 30, 1))
        s2 = llm.engine.stats()
        assert again == first
        assert s2.vision_encoder_calls == 1  # every image block came from the cache
        hit = s2.prefix_cache_hit_tokens - s1.prefix_cache_hit_tokens
        ids = llm.generate([ImagePrompt(TEXT, (png(40, 30, 1),))], SamplingParams(max_tokens=1))[0].prompt_token_ids
        assert hit >= len(ids) - 4  # all but the last (partial) block
    finally:
        llm.shutdown()


def test_another_image_behind_the_same_placeholders_misses(vlm_dir):
    llm = LLM(vlm_dir, dtype=torch.float32, block_size=4)
    try:
        first = _run(llm, png(40, 30, 1))
        before = llm.engine.stats()
        other = _run(llm, solid(40, 30, (255, 255, 255)))
        after = llm.engine.stats()
        assert after.vision_encoder_calls == 2
        hit = after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens
        offset = TEXT.index("<start_of_image>")
        assert hit <= len(llm.engine.tokenizer.encode(TEXT[:offset])) + 4  # the text before the image only
        assert other != first
    finally:
        llm.shutdown()


def _logprobs(llm) -> list[float]:
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    out = llm.generate([ImagePrompt(TEXT, (png(40, 30, 3),))], params)[0].outputs[0]
    return [step[t].logprob for step, t in zip(out.logprobs, out.token_ids)]


def test_chunked_prefill_never_splits_an_image(vlm_dir):
    whole = LLM(vlm_dir, dtype=torch.float32, enable_prefix_caching=False)
    try:
        want = _logprobs(whole)
    finally:
        whole.shutdown()
    # A budget of 10 tokens a step: the 16 image tokens run in one step of their own (split, the
    # first part's tokens would not see the rest of the image).
    chunked = LLM(vlm_dir, dtype=torch.float32, enable_prefix_caching=False, max_num_batched_tokens=10)
    try:
        assert _logprobs(chunked) == pytest.approx(want, abs=1e-5)
        assert chunked.engine.stats().vision_encoder_calls == 1
    finally:
        chunked.shutdown()
