"""lm-evaluation-harness's `local-completions` model against the server with no tokenizer
argument: it finds the server's vLLM-style /tokenizer_info and /tokenize, tokenizes through
them, and scores a loglikelihood task (a tiny task of our own, from a local JSON file, as there
is no dataset hub here). Its scores equal the sums of the continuation's token logprobs that
the server's own echoed /v1/completions gives for the same tokens."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from client_server import MODEL

LM_EVAL = Path(sys.executable).parent / "lm_eval"
DOCS = [{"question": "The capital of France is", "choices": ["Paris", "Rome"], "answer": 0},
        {"question": "The capital of Italy is", "choices": ["Paris", "Rome"], "answer": 1},
        {"question": "Two plus two is", "choices": ["four", "five", "six"], "answer": 0}]


def write_task(folder: Path) -> None:
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (folder / "mlxr_tiny.yaml").write_text(
        "task: mlxr_tiny\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")


def tokens(url: str, text: str) -> list[int]:
    r = httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False}, timeout=60)
    return r.json()["tokens"]


def echoed_loglikelihood(url: str, context: str, continuation: str) -> float:
    """The continuation's logprob given the context, tokenized apart and without BOS, as
    lm-eval's API models do (add_bos_token false)."""
    cont = tokens(url, continuation)
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": tokens(url, context) + cont,
                                                  "echo": True, "max_tokens": 0, "logprobs": 0, "temperature": 0},
                   timeout=60)
    return sum(r.json()["choices"][0]["logprobs"]["token_logprobs"][-len(cont):])


@pytest.mark.slow  # lm-eval's import (datasets, pandas, torch) and its run: about 20 s
def test_local_completions_without_a_tokenizer_scores_a_loglikelihood_task(client_server_url, tmp_path):
    write_task(tmp_path)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(LM_EVAL), "--model", "local-completions",
         "--model_args", f"model={MODEL},base_url={client_server_url}/v1/completions",
         "--tasks", "mlxr_tiny", "--include_path", str(tmp_path), "--output_path", str(tmp_path / "out"),
         "--log_samples"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Using remote tokenizer" in done.stderr, done.stderr[-3000:]
    (samples,) = (tmp_path / "out").glob("*/samples_mlxr_tiny_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in rows) == [0, 1, 2]
    for row in rows:
        doc = DOCS[row["doc_id"]]
        scores = [float(ll) for ll, _greedy in row["filtered_resps"]]
        expected = [echoed_loglikelihood(client_server_url, doc["question"], " " + c) for c in doc["choices"]]
        assert all(math.isclose(s, e, abs_tol=1e-3) for s, e in zip(scores, expected, strict=True)), (scores, expected)
        assert row["acc"] == float(scores.index(max(scores)) == doc["answer"])
