"""Encoders served: embeddings through the official openai and ollama clients equal
sentence-transformers', /v1/rerank, /rerank and /score equal its CrossEncoder, /api/show and
/v1/models mark them, and asking one to chat is a 400 naming the embedding routes."""
from __future__ import annotations

import httpx
import numpy as np
import ollama
import openai
import pytest

from encoder_fixtures import TEXTS, embedding_gemma_dir, encoder_dir
from server_harness import running_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    embedder, reranker = encoder_dir("bert-mean"), encoder_dir("xlmr-rerank")
    others = [a for d in (encoder_dir("nomic-mean"), embedding_gemma_dir()) for a in ("--model", str(d))]
    with running_server(home, "--model", str(embedder), "--model", str(reranker), *others) as url:
        names = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
        yield url, names


def _reference_vectors(texts: list[str], folder=None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder or encoder_dir("bert-mean")), device="cpu").encode(texts)


def _cosine_gap(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return float(np.abs(1 - cos).max())


def test_openai_client_embeds_as_sentence_transformers(server) -> None:
    url, _ = server
    model = _model_named(server, "bert-mean")
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    got = client.embeddings.create(model=model, input=TEXTS)
    vectors = [d.embedding for d in sorted(got.data, key=lambda d: d.index)]
    assert _cosine_gap(vectors, _reference_vectors(TEXTS)) < 1e-4
    assert got.usage.prompt_tokens > len(TEXTS)
    short = client.embeddings.create(model=model, input=TEXTS[:2], dimensions=8)
    head = _reference_vectors(TEXTS[:2])[:, :8]
    assert all(len(d.embedding) == 8 for d in short.data)
    assert _cosine_gap([d.embedding for d in short.data], head) < 1e-4
    assert abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5  # truncated, then normalised again


@pytest.mark.parametrize("fixture", ["nomic-mean", "embedding-gemma"])
def test_nomic_and_embedding_gemma_serve_sentence_transformers_vectors(server, fixture: str) -> None:
    folder = embedding_gemma_dir() if fixture == "embedding-gemma" else encoder_dir(fixture)
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="none")
    got = client.embeddings.create(model=_model_named(server, fixture), input=TEXTS)
    vectors = [d.embedding for d in sorted(got.data, key=lambda d: d.index)]
    assert _cosine_gap(vectors, _reference_vectors(TEXTS, folder)) < 1e-4
    show = httpx.post(server[0] + "/api/show", json={"model": _model_named(server, fixture)}).json()
    assert show["capabilities"] == ["embedding"]


def test_pooling_and_normalize_extensions(server) -> None:
    url, _ = server
    model = _model_named(server, "bert-mean")
    body = {"model": model, "input": TEXTS[:2], "pooling": "cls", "normalize": False}
    got = httpx.post(url + "/v1/embeddings", json=body).json()["data"]
    import torch
    from transformers import AutoModel, AutoTokenizer

    hf = AutoModel.from_pretrained(encoder_dir("bert-mean"), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(encoder_dir("bert-mean"))
    with torch.inference_mode():  # HF's first token's last hidden state, not normalised
        want = [hf(**tok(t, return_tensors="pt")).last_hidden_state[0, 0].numpy() for t in TEXTS[:2]]
    assert np.abs(np.array([d["embedding"] for d in got]) - np.array(want)).max() < 1e-4
    bad = httpx.post(url + "/v1/embeddings", json={"model": model, "input": "x", "pooling": "rank"})
    assert bad.status_code == 400 and "pooling" in bad.text


def test_ollama_client_embeds(server) -> None:
    url, _ = server
    model = _model_named(server, "bert-mean")
    client = ollama.Client(host=url)
    got = client.embed(model=model, input=TEXTS[:3])
    assert _cosine_gap(got.embeddings, _reference_vectors(TEXTS[:3])) < 1e-4
    legacy = client.embeddings(model=model, prompt=TEXTS[0])
    assert _cosine_gap([legacy.embedding], _reference_vectors(TEXTS[:1])) < 1e-4
    show = client.show(model)
    assert show.capabilities == ["embedding"]


def test_an_encoder_asked_to_chat_is_a_400(server) -> None:
    url, _ = server
    model = _model_named(server, "bert-mean")
    r = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    assert "embedding model" in r.text
    r = httpx.post(url + "/api/generate", json={"model": model, "prompt": "hi", "stream": False})
    assert r.status_code == 400, r.text


def _cross_encoder_scores(query: str, docs: list[str]) -> np.ndarray:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(encoder_dir("xlmr-rerank")), device="cpu").predict([(query, d) for d in docs])


@pytest.mark.parametrize("route", ["/v1/rerank", "/rerank"])
def test_rerank_scores_and_orders_as_cross_encoder(server, route: str) -> None:
    url, _ = server
    model = _model_named(server, "xlmr-rerank")
    docs = [TEXTS[1], {"text": TEXTS[4]}, TEXTS[5], TEXTS[0]]
    r = httpx.post(url + route, json={"model": model, "query": TEXTS[3], "documents": docs, "top_n": 3})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    want = _cross_encoder_scores(TEXTS[3], [TEXTS[1], TEXTS[4], TEXTS[5], TEXTS[0]])
    assert [x["index"] for x in results] == list(np.argsort(-want)[:3])
    for x in results:
        assert abs(x["relevance_score"] - want[x["index"]]) < 1e-4
        assert x["document"]["text"] == [TEXTS[1], TEXTS[4], TEXTS[5], TEXTS[0]][x["index"]]
    bare = httpx.post(url + route, json={"model": model, "query": "q", "documents": ["a"], "return_documents": False})
    assert "document" not in bare.json()["results"][0]


def test_vllm_score_route(server) -> None:
    url, _ = server
    model = _model_named(server, "xlmr-rerank")
    r = httpx.post(url + "/score", json={"model": model, "text_1": TEXTS[3], "text_2": TEXTS[4:6]})
    assert r.status_code == 200, r.text
    got = [d["score"] for d in r.json()["data"]]
    assert np.abs(np.array(got) - _cross_encoder_scores(TEXTS[3], TEXTS[4:6])).max() < 1e-4
    pairwise = httpx.post(url + "/v1/score", json={"model": model, "text_1": TEXTS[:2], "text_2": TEXTS[2:4]}).json()
    assert len(pairwise["data"]) == 2
    bad = httpx.post(url + "/v1/score", json={"model": model, "text_1": TEXTS[:2], "text_2": TEXTS[2:5]})
    assert bad.status_code == 400 and "text_2" in bad.text


def test_rerank_bounds_and_wrong_models_are_400s(server) -> None:
    url, _ = server
    reranker, embedder = _model_named(server, "xlmr-rerank"), _model_named(server, "bert-mean")
    many = httpx.post(url + "/v1/rerank", json={"model": reranker, "query": "q", "documents": ["d"] * 1001})
    assert many.status_code == 400 and "documents" in many.text
    long = httpx.post(url + "/v1/rerank", json={"model": reranker, "query": "q", "documents": ["d" * 100_001]})
    assert long.status_code == 400 and "documents" in long.text
    wrong = httpx.post(url + "/v1/rerank", json={"model": embedder, "query": "q", "documents": ["d"]})
    assert wrong.status_code == 400 and "not a reranker" in wrong.text
    embed = httpx.post(url + "/v1/embeddings", json={"model": reranker, "input": "q"})
    assert embed.status_code == 400 and "reranker" in embed.text


def _model_named(server, fixture: str) -> str:
    """The registry name `mlxr serve --model DIR` gave a fixture directory (its folder's name)."""
    _, names = server
    return next(n for n in names if n.startswith(fixture))
