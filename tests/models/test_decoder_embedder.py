"""A decoder embedding model (Qwen3-Embedding's layout: a bare Qwen3 backbone saved by
sentence-transformers with last-token pooling and Normalize) embeds through the paged engine
as sentence-transformers does, from the HF directory and from llama.cpp's GGUF (which carries
the pooling as qwen3.pooling_type). Both sides get the same token ids: sentence-transformers'."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_compare import llama_cpp_gguf
from mlxr import LLM
from mlxr.testing.encoder_fixtures import TEXTS, decoder_embedder_dir
from model_fixtures import FIXTURES


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(decoder_embedder_dir(FIXTURES)), device="cpu")
    ids = [st.tokenize([t])["input_ids"][0].tolist() for t in TEXTS]
    return ids, st.encode(TEXTS)


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_last_token_pooling_equals_sentence_transformers(reference, source: str) -> None:
    ids, want = reference
    path = decoder_embedder_dir(FIXTURES)
    llm = LLM(str(path if source == "hf" else llama_cpp_gguf(path)), dtype=torch.float32)
    try:
        assert llm.args.extra["pooling"] == "last"
        got = np.array([llm.engine.embed(i)[0] for i in ids])
    finally:
        llm.shutdown()
    assert np.abs(1 - (got * want).sum(1)).max() < 1e-4  # both normalised: 1 - cosine
    mean = got.mean(0)
    assert np.abs(got - mean).max() > 1e-3  # the inputs' vectors differ
