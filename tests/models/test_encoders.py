"""Encoders against sentence-transformers fp32 on tiny random models of each architecture: the
vectors (cosine within 1e-4) from the HF directory and from llama.cpp's converter's GGUF, the
cross-encoders' scores (within 1e-4), batching that changes nothing, pooling and dimensions."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from encoder_fixtures import TEXTS, embedding_gemma_dir, encoder_dir, encoder_gguf
from mlxr.engine.encoder.encoder_engine import EncoderEngine
from mlxr.engine.encoder.runner import EncoderInput
from mlxr.errors import InvalidParameterError
from mlxr.loader.encoder_model import load_encoder

EMBEDDERS = ["bert-mean", "bert-cls", "xlmr-mean", "nomic-mean"]
PAIRS = [(TEXTS[3], t) for t in TEXTS]


def _engine(path, max_batch_tokens: int = 2048) -> tuple[EncoderEngine, object]:
    e = load_encoder(str(path))
    return EncoderEngine(e.model, e.args, e.device, e.pooling, e.normalize, max_batch_tokens), e.tokenizer


def _embed(path, texts=TEXTS, **kw) -> np.ndarray:
    engine, tok = _engine(path, kw.pop("max_batch_tokens", 2048))
    try:
        return np.array(asyncio.run(engine.embed_many([tok.encode(t) for t in texts], **kw)))
    finally:
        engine.shutdown()


def _reference(name: str, texts=TEXTS) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(encoder_dir(name)), device="cpu").encode(texts)


def _cosine_gap(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(1 - (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).max())


@pytest.mark.parametrize("name", EMBEDDERS)
def test_hf_directory_equals_sentence_transformers(name: str) -> None:
    got, want = _embed(encoder_dir(name)), _reference(name)
    assert _cosine_gap(got, want) < 1e-4
    assert np.abs(got - want).max() < 1e-4  # the directory's own normalisation (or none) too


@pytest.mark.parametrize("name", EMBEDDERS)
def test_llama_cpp_gguf_equals_sentence_transformers(name: str) -> None:
    assert _cosine_gap(_embed(encoder_gguf(name)), _reference(name)) < 1e-4


def test_small_batches_change_nothing() -> None:
    whole = _embed(encoder_dir("bert-mean"))
    one_row_each = _embed(encoder_dir("bert-mean"), max_batch_tokens=1)
    assert np.abs(whole - one_row_each).max() < 1e-5


def test_pooling_override_and_dimensions() -> None:
    path = encoder_dir("bert-cls")
    cls = _reference("bert-cls")
    assert _cosine_gap(_embed(path, pooling="cls"), cls) < 1e-4
    mean = _embed(path, pooling="mean")
    assert _cosine_gap(mean, cls) > 1e-3  # a different pooling is a different vector
    head = _embed(path, dimensions=8)
    assert head.shape == (len(TEXTS), 8) and _cosine_gap(head, cls[:, :8]) < 1e-4
    with pytest.raises(InvalidParameterError, match="dimensions"):
        _embed(path, dimensions=33)
    with pytest.raises(InvalidParameterError, match="pooling"):
        _embed(path, pooling="max")


def _scores(path) -> np.ndarray:
    engine, tok = _engine(path)
    try:
        return np.array(asyncio.run(engine.score([EncoderInput(*tok.encode_pair(q, d)) for q, d in PAIRS])))
    finally:
        engine.shutdown()


def _cross_encoder(name: str) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(encoder_dir(name)), device="cpu").predict(PAIRS)


@pytest.mark.parametrize("name", ["bert-rerank", "xlmr-rerank"])
def test_cross_encoder_scores_equal_sentence_transformers(name: str) -> None:
    assert np.abs(_scores(encoder_dir(name)) - _cross_encoder(name)).max() < 1e-4


def test_xlm_roberta_reranker_gguf_equals_cross_encoder() -> None:
    """llama.cpp's converter keeps RoBERTa's classification head whole (cls, cls.output)."""
    assert np.abs(_scores(encoder_gguf("xlmr-rerank")) - _cross_encoder("xlmr-rerank")).max() < 1e-4


def test_reranker_embeds_nothing_and_embedder_scores_nothing() -> None:
    with pytest.raises(InvalidParameterError, match="reranker"):
        _embed(encoder_dir("xlmr-rerank"))
    with pytest.raises(InvalidParameterError, match="embeds"):
        _scores(encoder_dir("bert-mean"))


def test_gguf_reranker_is_marked_from_its_tensors() -> None:
    from mlxr.formats.gguf import open_gguf
    from mlxr.models.model_args import args_from_gguf

    with open_gguf(encoder_gguf("xlmr-rerank")) as f:
        assert args_from_gguf(f).extra["num_labels"] == 1
    with open_gguf(encoder_gguf("bert-mean")) as f:
        assert args_from_gguf(f).extra["num_labels"] == 0
    assert torch.get_default_dtype() == torch.float32


def test_the_generation_api_refuses_an_encoder_by_name() -> None:
    from mlxr import LLM
    from mlxr.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="embedding or reranking model"):
        LLM(str(encoder_dir("bert-mean")))


def test_nomic_ai_layout_equals_sentence_transformers() -> None:
    """nomic-ai's own checkpoint layout (fused Wqkv, fc11/fc12/fc2, n_embd...) loads as the same
    model as transformers' layout of the same weights."""
    from mlxr.testing.nomic_layout import nomic_original_dir

    assert _cosine_gap(_embed(nomic_original_dir(encoder_dir("nomic-mean"))), _reference("nomic-mean")) < 1e-4


@pytest.mark.parametrize("key,value", [("prenorm", True), ("rotary_emb_fraction", 0.5), ("qkv_proj_bias", True),
                                       ("causal", True), ("moe_every_n_layers", 2)])
def test_nomic_variants_it_does_not_implement_are_refused_by_name(tmp_path, key: str, value) -> None:
    import json
    import shutil

    from mlxr.errors import UnsupportedModelError
    from mlxr.testing.nomic_layout import nomic_original_dir

    src = nomic_original_dir(encoder_dir("nomic-mean"))
    shutil.copytree(src, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(UnsupportedModelError, match=key):
        load_encoder(str(tmp_path / "m"))


def test_embedding_gemma_equals_sentence_transformers_from_hf_and_gguf() -> None:
    """Gemma 3 run bidirectionally (windowed sliding layers), mean-pooled, two Dense projections,
    normalised: from its sentence-transformers directory and llama.cpp's gemma-embedding GGUF
    (written with --sentence-transformers-dense-modules)."""
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(embedding_gemma_dir()), device="cpu").encode(TEXTS)
    assert want.shape == (len(TEXTS), 64)
    assert _cosine_gap(_embed(embedding_gemma_dir()), want) < 1e-4
    assert _cosine_gap(_embed(encoder_gguf("embedding-gemma")), want) < 1e-4
    assert _cosine_gap(_embed(embedding_gemma_dir(), max_batch_tokens=1), want) < 1e-4  # unpadded


def test_the_sliding_window_is_bidirectional_and_bounded() -> None:
    from mlxr.models.gemma_embedding import window_masks

    masks = window_masks(torch.tensor([10, 6]), 10, 8)  # |i - j| < 8 // 2 + 1
    assert masks[True][0, 0, 5].tolist() == [False] + [True] * 9
    assert masks[True][1, 0, 0].tolist() == [True] * 5 + [False] * 5  # past the row's length: padding
    assert masks[False][0, 0, 0].all() and not masks[False][1, 0, 0, 6:].any()
