"""On the bundled Gemma 3 270M (a real model, a BOS token): structured output that always ends
(numbers bounded in the grammar, mlxr/engine/structured/json_bounds.py) at the temperatures
clients sample at (strings with a maxLength: the default cap of 8,192 characters ends a string,
not within a small max_tokens), and echoed completions logprobs whose offsets index the text."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from server_harness import running_server


def closed(properties: dict) -> dict:
    """An object of these properties, all required, no others (as Pydantic's extra="forbid" and
    strict mode send it: an open object lets a model add keys until max_tokens, as the schema allows)."""
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


SCHEMAS = [
    closed({"score": {"type": "number"}}),
    closed({"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}, "height_m": {"type": "number"}}),
    closed({"values": {"type": "array", "items": {"type": "number"}, "maxItems": 4}}),
    closed({"tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3, "uniqueItems": True}}),
    closed({"x": {"type": "number"}, "y": {"type": "number"}, "note": {"type": "string", "maxLength": 80}}),
]
PROMPTS = ["Rate the movie Inception from 0 to 10.", "Describe a person.", "Give me some measurements.",
           "Tag this photo of a beach.", "Where is the treasure?"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("home"), timeout_s=180) as url:  # no --model: the bundled one
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        yield c
        c.close()


def answer(client, schema: dict, prompt: str, seed: int, temperature: float):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    r = client.chat.completions.create(model="gemma3-270m", messages=[{"role": "user", "content": prompt + " Answer in JSON."}],
                                       response_format=fmt, temperature=temperature, seed=seed, max_tokens=400)
    return r.choices[0]


@pytest.mark.parametrize("temperature", [0.8, 1.0])
def test_schemas_with_numbers_and_strings_end_in_valid_json(client, temperature):
    cases = [(schema, prompt, seed) for schema, prompt in zip(SCHEMAS, PROMPTS) for seed in (1, 2, 3)]
    with ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(lambda c: answer(client, c[0], c[1], c[2], temperature), cases))
    for (schema, _, seed), choice in zip(cases, choices):
        text = choice.message.content
        assert choice.finish_reason == "stop", (seed, text[-200:])
        jsonschema.validate(json.loads(text), without_unique_items(schema))


def without_unique_items(schema: dict) -> dict:
    """uniqueItems is accepted and not enforced (docs/structured-output.md)."""
    text = json.dumps(schema).replace(', "uniqueItems": true', "")
    return json.loads(text)


def test_echoed_logprobs_offsets_index_the_returned_text(client):
    r = client.completions.create(model="gemma3-270m", prompt="The capital of France is", echo=True, logprobs=1,
                                  max_tokens=4, temperature=0)
    choice = r.choices[0]
    lp, text = choice.logprobs, choice.text
    assert text.startswith("The capital of France is") and lp.tokens[0] == "<bos>" and lp.text_offset[0] == 0
    for token, offset in zip(lp.tokens[1:], lp.text_offset[1:]):
        assert text[offset:offset + len(token)] == token, (token, offset, text)
    assert lp.text_offset == sorted(lp.text_offset)
