"""The OpenAI routes against a real `mlxr serve` subprocess, through the official client."""
from __future__ import annotations

import math
import subprocess

import httpx
import openai
import pytest
from server_harness import MLXR, running_server, scrape, tiny_llama_server

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with tiny_llama_server(tmp_path_factory.mktemp("home")) as url:
        yield url



def chat(client, model, text="hello there", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **kw)


def test_models_list_and_retrieve(client, model):
    assert ":" in model
    ids = [m.id for m in client.models.list().data]
    assert model in ids
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model:latest")


def test_chat_non_streaming(client, model):
    r = chat(client, model, max_tokens=6, **GREEDY)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.model == model
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_chat_streaming_matches_non_streaming(client, model):
    full = chat(client, model, max_tokens=8, **GREEDY).choices[0].message.content
    chunks = list(chat(client, model, max_tokens=8, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_max_completion_tokens(client, model):
    r = chat(client, model, max_completion_tokens=3, **GREEDY)
    assert r.usage.completion_tokens == 3


def test_completions_streaming_and_not(client, model):
    r = client.completions.create(model=model, prompt="once upon", max_tokens=7, **GREEDY)
    assert r.object == "text_completion" and r.usage.completion_tokens == 7
    chunks = list(client.completions.create(model=model, prompt="once upon", max_tokens=7, stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_completion_prompt_forms(client, model):
    r = client.completions.create(model=model, prompt=["a b", "c d", "e f"], max_tokens=2, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1, 2]
    ids = client.completions.create(model=model, prompt=[1, 50, 60, 70], max_tokens=2, **GREEDY)
    batch = client.completions.create(model=model, prompt=[[1, 50, 60, 70], [1, 80]], max_tokens=2, **GREEDY)
    assert batch.choices[0].text == ids.choices[0].text
    assert batch.usage.prompt_tokens == 6


def test_n_choices(client, model):
    r = chat(client, model, n=2, max_tokens=4, temperature=1.0, seed=1)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 8
    seen = {c.index for chunk in chat(client, model, n=2, max_tokens=4, stream=True) for c in chunk.choices}
    assert seen == {0, 1}
    comp = client.completions.create(model=model, prompt=["x", "y"], n=2, max_tokens=2)
    assert [c.index for c in comp.choices] == [0, 1, 2, 3]


def test_stop_strings(client, model):
    base = client.completions.create(model=model, prompt="the cat", max_tokens=30, **GREEDY).choices[0].text
    stop = next(base[i:i + 2] for i in range(3, len(base) - 2) if base[i:i + 2].strip() == base[i:i + 2])
    cut = base[: base.index(stop)]
    for s in (stop, [stop, "\x00never"]):
        r = client.completions.create(model=model, prompt="the cat", max_tokens=30, stop=s, **GREEDY)
        assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"


def test_seed_reproducible(client, model):
    def run(seed: int) -> str:
        return chat(client, model, max_tokens=12, temperature=1.0, seed=seed).choices[0].message.content

    assert run(42) == run(42)
    assert run(42) != run(7)


def test_chat_logprobs(client, model):
    r = chat(client, model, max_tokens=4, logprobs=True, top_logprobs=3, **GREEDY)
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert math.isclose(entry.logprob, tops[0], abs_tol=1e-5)  # greedy picks the top token


def test_completion_logprobs(client, model):
    r = client.completions.create(model=model, prompt="abc", max_tokens=5, logprobs=2, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(len(t) >= 2 for t in lp.top_logprobs)


def test_logit_bias_forces_a_token(client, model, base_url):
    r = client.completions.create(model=model, prompt="hi", max_tokens=4, logit_bias={"100": 100}, **GREEDY)
    toks = httpx.post(base_url + "/v1/completions", json={
        "model": model, "prompt": "hi", "max_tokens": 4, "logit_bias": {"100": 100}, "logprobs": 0,
        "temperature": 0}).json()["choices"][0]["logprobs"]["tokens"]
    assert len(set(toks)) == 1 and r.choices[0].text == toks[0] * 4


def test_include_usage_in_last_chunk(client, model):
    chunks = list(chat(client, model, max_tokens=5, stream=True, stream_options={"include_usage": True}, **GREEDY))
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 5
    assert last.usage.total_tokens == last.usage.prompt_tokens + 5
    assert all(c.usage is None for c in chunks[:-1])
    # Sampled with no seed, it can draw EOS before max_tokens (it did once, in a make test run).
    comp = list(client.completions.create(model=model, prompt="z", max_tokens=3, stream=True,
                                          stream_options={"include_usage": True}, **GREEDY))
    assert comp[-1].choices == [] and comp[-1].usage.completion_tokens == 3


def test_vllm_extras_and_ignored_fields(client, model):
    # (response_format is enforced now: tests/server/test_server_structured.py)
    r = chat(client, model, max_tokens=6, user="someone",
             extra_body={"top_k": 5, "min_p": 0.01, "repetition_penalty": 1.1, "min_tokens": 6,
                         "ignore_eos": True, "stop_token_ids": [2]}, presence_penalty=0.5, frequency_penalty=0.5)
    assert r.usage.completion_tokens == 6


def test_tools_are_accepted(client, model):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    r = chat(client, model, max_tokens=3, tools=tools, tool_choice="auto", **GREEDY)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_embeddings(client, model):
    one = client.embeddings.create(model=model, input="hello world")
    vec = one.data[0].embedding
    assert len(vec) == 64 and math.isclose(sum(x * x for x in vec), 1.0, rel_tol=1e-3)
    many = client.embeddings.create(model=model, input=["hello world", "bye"], encoding_format="float")
    assert [d.index for d in many.data] == [0, 1]
    assert many.data[0].embedding == pytest.approx(vec, abs=1e-5)
    assert many.usage.prompt_tokens > one.usage.prompt_tokens


def test_embeddings_take_openais_batch_of_2048_inputs(client, model):
    """LangChain's OpenAIEmbeddings sends 1,000 inputs a request (64 were the limit before);
    OpenAI takes 2,048."""
    texts = [f"text {i}" for i in range(300)]
    r = client.embeddings.create(model=model, input=texts)
    assert [d.index for d in r.data] == list(range(300))
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model, input=["x"] * 2049)
    assert "input" in str(e.value)
    # The tokens together are bounded as OpenAI bounds them (300,000), before any is embedded.
    with pytest.raises(openai.BadRequestError) as e:
        client.with_options(timeout=60).embeddings.create(model=model, input=[[7] * 200] * 2000)
    assert "400000 tokens" in str(e.value)


def test_bundled_model_smoke(tmp_path):
    """No --model: the bundled Gemma 3 270M is registered, preloaded and answers."""
    with running_server(tmp_path / "home", timeout_s=180) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert "gemma3-270m:latest" in [m.id for m in c.models.list().data]
        r = chat(c, "gemma3-270m", text="What is the capital of France?", max_tokens=8, **GREEDY)
        assert r.choices[0].message.content.strip()


def test_metrics_after_requests(client, model, base_url):
    chat(client, model, max_tokens=3, **GREEDY)
    m = scrape(base_url)
    label = f'model_name="{model}"'
    # request_queue_time_seconds stays empty: the engine does not record first_scheduled_time yet.
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_prompt_tokens",
                 "request_generation_tokens", "inter_token_latency_seconds"):
        assert m[f"vllm:{hist}_count{{{label}}}"] > 0, hist
    assert m[f'vllm:request_success_total{{finished_reason="length",{label}}}'] > 0
    assert m[f"vllm:generation_tokens_total{{{label}}}"] > 0
    assert m[f"vllm:prompt_tokens_total{{{label}}}"] > 0
    assert m[f"vllm:spec_decode_num_drafts_total{{{label}}}"] == 0
    assert m[f"mlxr:jump_forward_num_draft_tokens_total{{{label}}}"] == 0
    assert m[f"vllm:num_requests_running{{{label}}}"] == 0
    assert 0 <= m[f"vllm:kv_cache_usage_perc{{{label}}}"] <= 1
    stats = httpx.get(base_url + "/admin/stats").json()["models"][model]
    assert stats["generation_tokens_total"] == m[f"vllm:generation_tokens_total{{{label}}}"]


def test_mlxr_ps(base_url, model):
    port = base_url.rsplit(":", 1)[1]
    done = subprocess.run([str(MLXR), "ps", "--port", port], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split()[:2] == ["NAME", "ID"]
    assert any(r.startswith(model) for r in rows)
