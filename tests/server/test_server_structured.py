"""Structured output over HTTP on a random-weight model (nothing but the mask makes JSON), with
the official clients: OpenAI response_format (json_schema, and .parse with Pydantic models), vLLM's
structured_outputs / guided_* extras, Ollama's format; bad specs are 400s naming the problem;
hostile ones are answered in bounded time while another request keeps streaming."""
from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, Optional

import httpx
import jsonschema
import ollama
import pytest
from pydantic import BaseModel, ConfigDict, Field

from structured_schemas import FAST, SCHEMAS

ARGS = {"temperature": 1.0, "seed": 5, "max_tokens": 200}


@pytest.fixture(scope="module")
def base_url(shared_tiny_llama_url: str):
    return shared_tiny_llama_url  # tests/server/conftest.py



def ask(client, model, schema: dict) -> str:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Answer in JSON"}],
                                           response_format=fmt, **ARGS)
    assert reply.choices[0].finish_reason == "stop"
    return reply.choices[0].message.content


def check_suite(client, model, names: list[str]) -> None:
    with ThreadPoolExecutor(8) as pool:  # concurrent: the server batches them
        texts = list(pool.map(lambda n: ask(client, model, SCHEMAS[n]), names))
    for name, text in zip(names, texts):
        jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_response_format_json_schema_whole_suite(client, model):
    check_suite(client, model, sorted(SCHEMAS))


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, as strict mode wants
    name: str = Field(max_length=6)
    count: int = Field(ge=0, le=9)


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, as strict mode wants
    kind: Literal["buy", "sell"]
    items: list[Item] = Field(min_length=1, max_length=2)
    note: Optional[str] = Field(max_length=4)


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, as strict mode wants
    x: float = Field(ge=-1, le=1)
    label: Literal["é", "日本"]


@pytest.mark.parametrize("model_cls", [Order, Point, Item])
def test_parse_with_pydantic_models(client, model, model_cls):
    reply = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Give one"}],
                                          response_format=model_cls, **ARGS)
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, model_cls)
    model_cls.model_validate_json(reply.choices[0].message.content)


LOOSE = {  # no additionalProperties anywhere, and optional fields: what strict mode tightens
    "type": "object", "properties": {
        "name": {"type": "string", "maxLength": 5},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
            "k": {"type": "string", "maxLength": 3}, "v": {"type": "integer", "minimum": 0, "maximum": 9}}}},
        "size": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name"]}


def keys_everywhere(doc: dict) -> list[set]:
    return [set(doc)] + [set(t) for t in doc.get("tags", [])]


def test_strict_json_schema_forbids_extra_keys_and_requires_every_property(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "loose", "schema": LOOSE, "strict": True}}
    for seed in range(6):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "JSON"}],
                                               response_format=fmt, **{**ARGS, "seed": seed})
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), LOOSE)
        assert strict_shape(reply.choices[0].message.content), reply.choices[0].message.content


def strict_shape(text: str) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return keys_everywhere(doc) == [{"name", "tags", "size"}] + [{"k", "v"}] * len(doc.get("tags", []))


def test_without_strict_the_schema_means_what_it_says(client, model):
    """The contrast: the same requests without strict leave optional keys out or add others
    (a random model under a loose schema often writes extra keys until max_tokens)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "loose", "schema": LOOSE}}
    replies = [client.chat.completions.create(model=model, messages=[{"role": "user", "content": "JSON"}],
                                              response_format=fmt, **{**ARGS, "seed": seed}).choices[0]
               for seed in range(6)]
    for r in replies:
        if r.finish_reason == "stop":
            jsonschema.validate(json.loads(r.message.content), LOOSE)
    assert not all(strict_shape(r.message.content) for r in replies)


def test_completions_route_and_streaming(client, model):
    schema = SCHEMAS["record_like"]
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    out = client.completions.create(model=model, prompt="Data:", extra_body={"response_format": fmt}, **ARGS)
    jsonschema.validate(json.loads(out.choices[0].text), schema)
    chunks = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                            response_format=fmt, stream=True, **ARGS)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)


def test_vllm_extras_regex_choice_grammar(client, model):
    def complete(extra):
        return client.completions.create(model=model, prompt="Hi", extra_body=extra, **ARGS).choices[0].text
    assert re.fullmatch(r"[A-Z]{2}[0-9]{3}", complete({"structured_outputs": {"regex": "[A-Z]{2}[0-9]{3}"}}))
    assert complete({"structured_outputs": {"choice": ["alpha", "beta"]}}) in ("alpha", "beta")
    lark = 'start: "<" word (" " word)* ">"\nword: /[xyz]{1,4}/'
    assert re.fullmatch(r"<[xyz]{1,4}( [xyz]{1,4})*>", complete({"structured_outputs": {"grammar": lark}}))
    assert complete({"guided_choice": ["left", "right"]}) in ("left", "right")
    assert re.fullmatch(r"[0-9]{4}", complete({"guided_regex": "[0-9]{4}"}))
    jsonschema.validate(json.loads(complete({"guided_json": SCHEMAS["ref_defs"]})), SCHEMAS["ref_defs"])


def test_ollama_format_schema(base_url, model):
    client = ollama.Client(host=base_url, timeout=120)
    options = {"temperature": 1.0, "seed": 9, "num_predict": 200}
    for name in FAST[:5]:
        out = client.chat(model=model, messages=[{"role": "user", "content": "JSON"}], format=SCHEMAS[name],
                          options=options)
        jsonschema.validate(json.loads(out.message.content), SCHEMAS[name])
    out = client.generate(model=model, prompt="JSON", format=Order.model_json_schema(), options=options)
    Order.model_validate_json(out.response)


@pytest.mark.parametrize("body, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
      {"type": "integer", "minimum": 3, "maximum": 1}}}}, "minimum"),
    ({"structured_outputs": {"regex": "(("}}, "regex"),
    ({"structured_outputs": {"grammar": "start: nowhere"}}, "nowhere"),
    ({"structured_outputs": {"choice": ["a"]}, "guided_regex": "b"}, "one constraint"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    # Both bounds at the 64-bit minimum crashed the server process inside llguidance 1.9.1;
    # bounds past 64 bits were clamped (a 200 whose number broke the schema).
    ({"guided_json": {"type": "integer", "minimum": -9223372036854775807, "maximum": -9223372036854775807}},
     "out of range"),
    ({"guided_json": {"type": "integer", "minimum": 10 ** 30, "maximum": 10 ** 30 + 5}}, "out of range"),
    ({"structured_outputs": {"grammar": 'start: %json {"type": "integer", "minimum": -9223372036854775807, '
                                        '"maximum": -9223372036854775807}'}}, "+-2^53"),
])
def test_bad_specs_are_400_naming_the_problem(base_url, model, body, words):
    r = httpx.post(base_url + "/v1/completions", json={"model": model, "prompt": "x", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    ok = httpx.post(base_url + "/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200, ok.text  # and the server still serves


def _deep(n: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


HOSTILE = [  # (body, status, words the 400 names)
    ({"guided_json": _deep(200)}, 400, "deeper"),  # deep nesting
    ({"guided_json": {"enum": [f"value-{i}" for i in range(50_000)]}}, 400, "bytes"),  # a huge enum
    ({"guided_choice": [f"c{i}" for i in range(5000)]}, 400, "choice"),
    # Exponential for a backtracking engine, linear for llguidance's lazy derivative lexer: served.
    ({"guided_regex": "(a|b)*a(a|b){60}"}, 200, ""),
    ({"guided_regex": "(a|aa)*b"}, 200, ""),
    ({"guided_regex": "(x+x+)+y"}, 200, ""),
    # Nested counted repetition is what costs llguidance (a{1000}{1000}: ~1 s of lexer work a request).
    ({"guided_regex": "a{1000}{1000}"}, 400, "nests counted repetitions to 1000000 repeats"),
    ({"guided_regex": "((a{1,1000}){1,1000}){1,1000}"}, 400, "nests counted repetitions"),
    ({"guided_json": {"type": "string", "pattern": "^(a{100}){1000}$"}}, 400, "json schema pattern"),
    ({"structured_outputs": {"grammar": "start: A\nA: /(x{100}){1000}/"}}, 400, "a regex of the grammar"),
]
HOSTILE_S = 5.0  # each is answered within this (the frontend's compile timeout is 10 s)


def test_hostile_grammars_are_answered_in_bounded_time_while_another_streams(base_url, model, client):
    arrivals: list[float] = []
    done = threading.Event()

    def stream():  # one greedy stream after another until the hostile requests are answered
        while not done.is_set():
            for _ in client.completions.create(model=model, prompt="go", max_tokens=200, temperature=0,
                                               extra_body={"ignore_eos": True}, stream=True):
                arrivals.append(time.monotonic())  # a chunk may carry several tokens: arrivals, not tokens

    streamer = threading.Thread(target=stream)
    streamer.start()
    deadline = time.monotonic() + 60
    while len(arrivals) < 3 and time.monotonic() < deadline and streamer.is_alive():
        time.sleep(0.01)
    spans = []
    try:
        for body, status, words in HOSTILE:
            start = time.monotonic()
            r = httpx.post(base_url + "/v1/completions", timeout=60,
                           json={"model": model, "prompt": "x", "max_tokens": 16, **body})
            spans.append((start, time.monotonic()))
            assert r.status_code == status, (str(body)[:200], r.text[:300])
            assert words in (r.json()["error"]["message"] if status == 400 else "")
            assert spans[-1][1] - start < HOSTILE_S, (str(body)[:100], spans[-1][1] - start)
    finally:
        done.set()
        streamer.join(120)
    during = [t for t in arrivals if spans[0][0] <= t <= spans[-1][1]]
    gaps = [b - a for a, b in zip([spans[0][0]] + during, during + [spans[-1][1]])]
    assert len(during) > len(HOSTILE) and max(gaps) < 1.0, ("the stream stalled", len(during), max(gaps))


def _alternation(n: int, prefix: str = "w") -> str:
    return "start: " + " | ".join(f'"{prefix}{i}"' for i in range(n))


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
FAILS_ON_FIRST_TOKENS = [  # (route, body, words): each was a 500 with llguidance's message
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
     "matches nothing"),
    (COMPLETIONS, {"structured_outputs": {"regex": r"[^\s\S]"}}, "matches nothing"),
    (COMPLETIONS, {"guided_regex": r"ab[^\s\S]"}, "matches nothing"),
    (COMPLETIONS, {"guided_json": {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}},
     "forces text without end"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}}}}}, "forces text without end"),
    (COMPLETIONS, {"structured_outputs": {"grammar": 'start: "a" start'}}, "forces text without end"),
    (COMPLETIONS, {"structured_outputs": {"grammar": 'start: x\nx: "(" x ")"'}}, "forces text without end"),
    (COMPLETIONS, {"structured_outputs": {"grammar": _alternation(2500)}}, "2501 alternatives"),
    (COMPLETIONS, {"guided_grammar": _alternation(2200, prefix="")}, "alternatives at one point after '1'"),
    (COMPLETIONS, {"guided_grammar": 'start: "x" | "y" big\nbig: ' + _alternation(2100)[len("start: "):]},
     "alternatives at one point after 'y'"),
]


@pytest.mark.parametrize("route, body, words", FAILS_ON_FIRST_TOKENS, ids=range(len(FAILS_ON_FIRST_TOKENS)))
def test_grammars_that_fail_on_their_first_tokens_are_400s_in_bounded_time(base_url, model, route, body, words):
    """Grammars that match nothing, force text without end or offer more alternatives at one
    point than the parser follows: a 400 naming the problem (the frontend tries the grammar's
    first steps), not a 500 from the engine core once the request ran; the server serves on."""
    prompt = {"messages": [{"role": "user", "content": "x"}]} if route == CHAT else {"prompt": "x"}
    start = time.monotonic()
    r = httpx.post(base_url + route, json={"model": model, "max_tokens": 8, **prompt, **body}, timeout=60)
    assert time.monotonic() - start < HOSTILE_S
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "structured_outputs", error
    assert words in error["message"], error["message"]
    ok = httpx.post(base_url + route, json={"model": model, "max_tokens": 2, **prompt}, timeout=60)
    assert ok.status_code == 200, ok.text


def test_ollama_format_that_matches_nothing_is_a_400(base_url, model):
    client = ollama.Client(host=base_url, timeout=60)
    with pytest.raises(ollama.ResponseError, match="matches nothing") as e:
        client.generate(model=model, prompt="JSON", format={"$ref": "#"}, options={"num_predict": 8})
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="forces text without end") as e:
        client.chat(model=model, messages=[{"role": "user", "content": "x"}], options={"num_predict": 8},
                    format={"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})
    assert e.value.status_code == 400
    assert client.generate(model=model, prompt="x", options={"num_predict": 2}).done
