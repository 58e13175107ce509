"""Retrieval through real clients: LangChain's OpenAIEmbeddings and OllamaEmbeddings, and the
official Cohere SDK's rerank (v2 and v1 clients), against encoders served by `mlxr serve`; the
vectors and scores equal sentence-transformers'."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from encoder_fixtures import TEXTS, encoder_dir
from server_harness import running_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    embedder, reranker = encoder_dir("nomic-mean"), encoder_dir("xlmr-rerank")
    with running_server(tmp_path_factory.mktemp("home"), "--model", str(embedder), "--model", str(reranker)) as url:
        names = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
        yield url, next(n for n in names if n.startswith("nomic")), next(n for n in names if n.startswith("xlmr"))


def _vectors(texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(encoder_dir("nomic-mean")), device="cpu").encode(texts)


def _scores(query: str, docs: list[str]) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(encoder_dir("xlmr-rerank")), device="cpu").predict([(query, d) for d in docs])


def _cosine_gap(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(1 - (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).max())


@pytest.mark.parametrize("api", ["openai", "ollama"])
def test_langchain_embeddings(served, api: str) -> None:
    url, embedder, _ = served
    if api == "openai":
        from langchain_openai import OpenAIEmbeddings

        # check_embedding_ctx_length would fetch tiktoken's tables; the server counts its own tokens
        client = OpenAIEmbeddings(model=embedder, base_url=url + "/v1", api_key="unused",
                                  check_embedding_ctx_length=False, max_retries=0)
    else:
        from langchain_ollama import OllamaEmbeddings

        client = OllamaEmbeddings(model=embedder, base_url=url)
    want = _vectors(TEXTS)
    assert _cosine_gap(client.embed_documents(TEXTS), want) < 1e-4
    assert _cosine_gap([client.embed_query(TEXTS[2])], want[2:3]) < 1e-4


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_cohere_sdk_reranks_as_the_cross_encoder(served, version: str) -> None:
    import cohere

    url, _, reranker = served
    docs = [TEXTS[1], TEXTS[4], TEXTS[5], TEXTS[0]]
    client = (cohere.ClientV2 if version == "v2" else cohere.Client)(api_key="unused", base_url=url)
    got = client.rerank(model=reranker, query=TEXTS[3], documents=docs, top_n=3)
    want = _scores(TEXTS[3], docs)
    assert [r.index for r in got.results] == list(np.argsort(-want)[:3])
    assert max(abs(r.relevance_score - want[r.index]) for r in got.results) < 1e-4
