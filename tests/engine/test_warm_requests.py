"""The server's own warm-up requests at start (mlxr/server/warm_requests.py): they run through
the API before the first user's request, and nothing that reports the users' traffic counts them."""
from __future__ import annotations

import httpx
import pytest
from model_fixtures import fixture_model
from server_harness import scrape, server_log, tiny_llama_server

from mlxr import LLM, SamplingParams


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def base_url(home):
    with tiny_llama_server(home) as url:
        yield url


def counts(base_url: str) -> dict[str, float]:
    """The request and token counters of /metrics, summed over their labels."""
    names = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
             "vllm:prefix_cache_queries_total", "vllm:e2e_request_latency_seconds_count",
             "vllm:time_to_first_token_seconds_count")
    m = scrape(base_url)
    return {n: sum(v for k, v in m.items() if k.split("{")[0] == n) for n in names}


def test_a_fresh_server_warmed_up_through_its_api_and_counts_none_of_it(base_url, home):
    log = server_log(home)
    assert "warm-up: 2 requests through the API" in log
    assert "warm-up request to" not in log  # both answered 200 (a failure logs its route)
    assert '"route": "/v1/' not in log  # no request log line
    assert set(counts(base_url).values()) == {0.0}
    stats = next(iter(httpx.get(base_url + "/admin/stats").json()["models"].values()))
    assert stats["prompt_tokens_total"] == 0 and stats["finished_by_reason"] == {}


def test_user_requests_count_and_a_wrong_warm_up_header_is_a_user_request(base_url, home):
    model = httpx.get(base_url + "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "hello", "max_tokens": 3, "temperature": 0}
    before = counts(base_url)
    assert httpx.post(base_url + "/v1/completions", json=body).status_code == 200
    r = httpx.post(base_url + "/v1/completions", json=body, headers={"x-mlxr-warm-up": "0" * 32})
    assert r.status_code == 200
    after = counts(base_url)
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 2
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 6
    assert after["vllm:e2e_request_latency_seconds_count"] - before["vllm:e2e_request_latency_seconds_count"] == 2
    assert server_log(home).count('"route": "/v1/completions"') == 2


def test_forget_counts_starts_the_engine_counters_over():
    llm = LLM(str(fixture_model("tiny-llama").hf_dir), dtype="float32")
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = list(range(3, 40))
    llm.generate([prompt], params)
    assert llm.engine.stats().prefix_cache_queried_tokens > 0
    llm.engine.forget_counts()
    s = llm.engine.stats()
    assert (s.prompt_tokens_total, s.generation_tokens_total, s.finished_by_reason) == (0, 0, {})
    assert (s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens) == (0, 0)
    llm.generate([prompt], params)  # its full blocks are cached now
    s = llm.engine.stats()
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (len(prompt), 4)
    assert s.prefix_cache_queried_tokens > 0 and s.prefix_cache_hit_tokens > 0
    assert s.prefix_cache_queried_tokens < 2 * len(prompt)


def test_a_core_whose_counters_began_again_is_reported_whole():
    llm = LLM(str(fixture_model("tiny-llama").hf_dir), dtype="float32")
    llm.generate([list(range(3, 40))], SamplingParams(max_tokens=2, temperature=0.0))
    raw = llm.engine.core.stats()
    llm.engine.forget_counts()
    llm.engine._core_base = llm.engine._core_base.__class__(  # a base above what the core now reports
        *[getattr(raw, f) * 10 + 10 if isinstance(getattr(raw, f), int) else getattr(raw, f)
          for f in raw.__struct_fields__])
    assert llm.engine.stats().prefix_cache_queried_tokens == raw.prefix_cache_queried_tokens
