"""Bad requests get a JSON 4xx naming the problem, and the server keeps serving."""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode


@pytest.fixture(scope="module")
def base_url(shared_tiny_llama_url: str):
    return shared_tiny_llama_url  # tests/server/conftest.py


@pytest.fixture(scope="module")
def model(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=60) as c:
        yield c


def expect_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    text = err["message"] if isinstance(err, dict) else err
    for w in words:
        assert w in text, (w, text)


def still_serving(http, model) -> None:
    r = http.post("/v1/completions", json={"model": model, "prompt": "ok", "max_tokens": 2})
    assert r.status_code == 200, r.text


def chat_body(model, **over):
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **over}


def test_malformed_json(http, model):
    for raw in (b"{", b"not json", b'{"model": "x",}', b"\xff\xfe", b"[]", b"null"):
        r = http.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    still_serving(http, model)


@pytest.mark.parametrize("field,value", [
    ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", "ten"), ("max_tokens", 10**30),
    ("n", 0), ("n", 10_000), ("n", -3), ("top_k", -2), ("top_k", 1 << 40), ("temperature", -1),
    ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5), ("presence_penalty", 3),
    ("frequency_penalty", -9), ("top_logprobs", 21), ("top_logprobs", -1), ("seed", 1 << 70),
    ("stop", 5), ("stop", [""]), ("stop", ["x"] * 100), ("logit_bias", {"abc": 1}),
    ("logit_bias", {"5": 101}), ("logit_bias", {"-5": 1}), ("logit_bias", {"999999": 1}),
    ("min_p", 2), ("repetition_penalty", 0), ("min_tokens", 5), ("stop_token_ids", [-1]),
    ("messages", "hi"), ("messages", [{"role": "wizard", "content": "x"}]), ("stream", "maybe"),
])
def test_chat_field_out_of_range(http, model, field, value):
    r = http.post("/v1/chat/completions", json=chat_body(model, **{field: value}))
    expect_error(r, 400, field)


@pytest.mark.parametrize("field,value", [
    ("logprobs", 21), ("logprobs", -1), ("prompt", []), ("prompt", [[]]), ("prompt", [[1], []]),
    ("prompt", [-1, 5]), ("prompt", [100000]), ("prompt", ["x"] * 100), ("suffix", "tail"),
    ("best_of", 3), ("max_tokens", -5),
])
def test_completion_field_out_of_range(http, model, field, value):
    body = {"model": model, "prompt": "hello", "max_tokens": 2, field: value}
    expect_error(http.post("/v1/completions", json=body), 400, field)


def test_top_logprobs_needs_logprobs(http, model):
    expect_error(http.post("/v1/chat/completions", json=chat_body(model, top_logprobs=2)), 400, "top_logprobs")


def test_unknown_model_is_404(http):
    for path, body in (("/v1/chat/completions", chat_body("nope:latest")),
                       ("/v1/completions", {"model": "nope", "prompt": "x"}),
                       ("/v1/embeddings", {"model": "../../etc/passwd", "input": "x"})):
        r = http.post(path, json=body)
        expect_error(r, 404, "not found")
    expect_error(http.get("/v1/models/nope:latest"), 404, "nope")


def test_prompt_longer_than_context_names_both_lengths(http, model):
    long = [1] + [5] * 300
    r = http.post("/v1/completions", json={"model": model, "prompt": long, "max_tokens": 1})
    expect_error(r, 400, "301", "256")
    r = http.post("/v1/completions", json={"model": model, "prompt": [1, 5, 6], "max_tokens": 1000})
    expect_error(r, 400, "1000", "256")
    r = http.post("/v1/chat/completions", json=chat_body(model, messages=[{"role": "user", "content": "a " * 400}]))
    expect_error(r, 400, "256")
    r = http.post("/v1/embeddings", json={"model": model, "input": long})
    expect_error(r, 400, "301", "256")
    still_serving(http, model)


def test_empty_messages(http, model):
    expect_error(http.post("/v1/chat/completions", json=chat_body(model, messages=[])), 400, "messages")
    r = http.post("/v1/chat/completions", json={"model": model})
    expect_error(r, 400, "messages")


def test_unsupported_content_part(http, model):
    msg = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    expect_error(http.post("/v1/chat/completions", json=chat_body(model, messages=msg)), 400, "image_url")


def test_text_part_without_its_text_names_what_is_missing(http, model):
    for part in ({"type": "text"}, {"type": "text", "text": None}):
        msg = [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]
        r = http.post("/v1/chat/completions", json=chat_body(model, messages=msg))
        expect_error(r, 400, "messages[0].content[1].text: is missing")
    for part in ({"type": "input_text"}, {"type": "input_text", "text": 5}):
        r = http.post("/v1/responses", json={"model": model, "max_output_tokens": 2, "store": False,
                                             "input": [{"role": "user", "content": [part]}]})
        expect_error(r, 400, "input[0].content[0].text: is missing")
    still_serving(http, model)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("field, value", [
    ("best_of", 3), ("best_of", 2), ("use_beam_search", True), ("prompt_logprobs", 21), ("prompt_logprobs", -1),
])
def test_vllm_fields_for_what_is_not_done_are_400s_naming_them(http, model, route, field, value):
    """As vLLM refuses what it does not support (best_of past n, beam search), rather than
    ignoring them; prompt_logprobs past the logprobs bound likewise."""
    body = chat_body(model) if "chat" in route else {"model": model, "prompt": "hi", "max_tokens": 2}
    expect_error(http.post(route, json={**body, field: value}), 400, f"{field}: ")


def test_a_chat_template_in_the_request_is_refused(http, model):
    """vLLM refuses one unless started with --trust-request-chat-template."""
    r = http.post("/v1/chat/completions", json=chat_body(model, chat_template="{{ 'x' }}"))
    expect_error(r, 400, "chat_template: ")
    r = http.post("/v1/chat/completions", json=chat_body(model, chat_template_kwargs={"chat_template": "{{ 'x' }}"}))
    expect_error(r, 400, "chat_template_kwargs: ", "chat_template")


def test_the_no_op_values_of_those_fields_pass(http, model):
    """Clients send them (vLLM's own benchmark sends best_of: 1): n, false, null."""
    fields = {"use_beam_search": False, "prompt_logprobs": None}
    for n in (1, 2):
        for best_of in (None, n):
            chat = http.post("/v1/chat/completions", json=chat_body(model, n=n, best_of=best_of, chat_template=None,
                                                                    **fields))
            assert chat.status_code == 200 and len(chat.json()["choices"]) == n, chat.text
            completion = http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2, "n": n,
                                                            "best_of": best_of, **fields})
            assert completion.status_code == 200 and len(completion.json()["choices"]) == n, completion.text


def test_oversized_body_is_413(http, model):
    big = b'{"model": "x", "prompt": "' + b"a" * (9 << 20) + b'"}'
    expect_error(http.post("/v1/completions", content=big, headers={"Content-Type": "application/json"}), 413, "body")

    def chunks():
        for _ in range(10):
            yield b"a" * (1 << 20)

    r = http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    expect_error(r, 413, "body")
    still_serving(http, model)


def test_wrong_method_and_route(http):
    expect_error(http.get("/v1/chat/completions"), 405, "Method")
    expect_error(http.get("/v1/nothing"), 404, "Not Found")


def test_extreme_but_legal_sampling(http, model):
    for over in ({"temperature": 1e-6}, {"top_p": 1e-9, "temperature": 1.0}, {"temperature": 100.0},
                 {"top_k": 1 << 30}, {"min_p": 1.0}, {"logit_bias": {"3": -100, "4": 100}},
                 {"presence_penalty": 2, "frequency_penalty": -2, "repetition_penalty": 100}):
        body = chat_body(model, max_tokens=4, logprobs=True, top_logprobs=20, **over)
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, (over, r.text)


def _shorten(body: object) -> None:
    """Keep generated requests cheap: few tokens, few choices."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int) and body[key] > 4:
            body[key] = 4
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_no_server_errors(base_url, mode):
    """Generated requests for every /v1 operation: never a 5xx, always a JSON body."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json").include(path_regex=r"^/v1/")
    operations = [result.ok() for result in schema.get_all_operations()]
    # chat, completions, models, a model, embeddings, responses, Anthropic's messages and count_tokens,
    # rerank and score, vLLM's load_lora_adapter and unload_lora_adapter
    assert len(operations) == 12
    failures: list[str] = []
    for op in operations:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case) -> None:
            _shorten(case.body)
            response = case.call(timeout=60)
            kind = (response.headers.get("content-type") or [""])[0]
            if response.status_code >= 500 or not kind.startswith(("application/json", "text/event-stream")):
                failures.append(f"{op.label} {case.body!r:.300} -> {response.status_code} {response.text[:300]}")

        try:
            check()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # GET /v1/models has nothing to get wrong
    assert not failures, "\n".join(failures[:10])
