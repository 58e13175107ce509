"""A decoder reranker (Qwen3-Reranker's layout: a Qwen3 causal LM named as the real model, with
"yes" and "no" tokens) on /v1/rerank and /score: each score equals HF transformers fp32's
softmax over the "no" and "yes" logits after the model card's prompt, within 1e-4; the same from
the GGUF llama.cpp's converter writes (rank pooling, a two-row cls.output, no lm_head) of an
untied and of a tied checkpoint."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from mlxr.models.qwen3_reranker import rerank_prompt
from mlxr.testing.encoder_fixtures import TEXTS, qwen3_reranker_dir
from model_fixtures import FIXTURES
from server_harness import running_server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = qwen3_reranker_dir(FIXTURES)
    # fp32 weights: the server's CPU default stores them in fp16, and this compares with HF fp32
    with running_server(tmp_path_factory.mktemp("home"), "--model", str(path), "--dtype", "float32") as url:
        yield url, httpx.get(url + "/v1/models").json()["data"][0]["id"], path


@pytest.fixture(scope="module")
def served_ggufs(tmp_path_factory):
    """Each fixture's GGUF under a name of its own (both converters' files are llama-cpp-f32)."""
    import shutil

    from hf_compare import llama_cpp_gguf

    folder, dirs = tmp_path_factory.mktemp("ggufs"), {}
    for kind in ("untied", "tied"):
        hf = qwen3_reranker_dir(FIXTURES, tied=kind == "tied")
        dirs[kind] = hf
        shutil.copy(llama_cpp_gguf(hf), folder / f"qwen3-reranker-{kind}.gguf")
    args = [a for kind in dirs for a in ("--model", str(folder / f"qwen3-reranker-{kind}.gguf"))]
    with running_server(tmp_path_factory.mktemp("home"), *args, "--dtype", "float32") as url:
        names = [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]]
        yield url, {kind: (next(n for n in names if kind in n and (kind == "tied") == ("untied" not in n)), hf)
                    for kind, hf in dirs.items()}


def _reference(path, query: str, docs: list[str]) -> np.ndarray:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    out = []
    with torch.inference_mode():
        for d in docs:
            ids = tok(rerank_prompt(query, d), add_special_tokens=False)["input_ids"]
            last = model(torch.tensor([ids])).logits[0, -1]
            out.append(torch.softmax(last[[no, yes]], -1)[1].item())
    return np.array(out)


def test_qwen3_reranker_scores_equal_hf(served) -> None:
    url, model, path = served
    docs = TEXTS[:4]
    r = httpx.post(url + "/v1/rerank", json={"model": model, "query": TEXTS[3], "documents": docs}, timeout=120)
    assert r.status_code == 200, r.text
    want = _reference(path, TEXTS[3], docs)
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert np.abs(np.array([got[i] for i in range(len(docs))]) - want).max() < 1e-4
    assert [x["index"] for x in r.json()["results"]] == list(np.argsort(-want))
    assert np.ptp(want) > 1e-3  # the documents' scores differ
    s = httpx.post(url + "/score", json={"model": model, "text_1": TEXTS[3], "text_2": docs[:2]}, timeout=120)
    assert np.abs(np.array([d["score"] for d in s.json()["data"]]) - want[:2]).max() < 1e-4


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_qwen3_reranker_gguf_scores_equal_hf(served_ggufs, kind: str) -> None:
    url, models = served_ggufs
    model, path = models[kind]
    docs = TEXTS[:4]
    r = httpx.post(url + "/v1/rerank", json={"model": model, "query": TEXTS[3], "documents": docs}, timeout=120)
    assert r.status_code == 200, r.text
    want = _reference(path, TEXTS[3], docs)
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert np.abs(np.array([got[i] for i in range(len(docs))]) - want).max() < 1e-4
    assert np.ptp(want) > 1e-3
