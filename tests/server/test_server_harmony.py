"""gpt-oss's harmony format on the servers, through the official openai client: a tool call
round-trips (the call, then the tool's result rendered back through the template, then the final
answer with its reasoning separated), whole and streamed.

The model is tiny-gpt_oss with harmony's special tokens and a harmony template
(mlxr/testing/gpt_oss_fixtures.py). Random weights write no harmony of their own, so each
request carries a Lark grammar (vLLM's `structured_outputs` extra) that fixes the reply's
headers and leaves the bodies' words to the model: the text goes through the real engine,
detokenizer (special tokens kept) and harmony splitter."""
from __future__ import annotations

import json

import openai
import pytest

from model_fixtures import FIXTURES
from server_harness import running_server

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The call: reasoning, a preamble on the commentary channel, then the call itself.
CALL = ('start: <|channel|> "analysis" <|message|> WORDS <|end|> '
        '<|start|> "assistant" <|channel|> "commentary" <|message|> WORDS <|end|> '
        '<|start|> "assistant to=functions.get_weather" <|channel|> "commentary json" <|message|> '
        '"{\\"city\\": \\"Paris\\"}" <|call|>\n'
        'WORDS: /[a-z]{1,6}( [a-z]{1,6}){0,2}/\n')
FINAL = ('start: <|channel|> "analysis" <|message|> WORDS <|end|> '
         '<|start|> "assistant" <|channel|> "final" <|message|> WORDS <|return|>\n'
         'WORDS: /[a-z]{1,6}( [a-z]{1,6}){0,2}/\n')


def _extra(grammar: str) -> dict:
    return {"extra_body": {"structured_outputs": {"grammar": grammar}}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from mlxr.testing.gpt_oss_fixtures import harmony_fixture_dir

    model = harmony_fixture_dir(FIXTURES)
    with running_server(tmp_path_factory.mktemp("home"), "--model", str(model)) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x")
        yield c, c.models.list().data[0].id


def test_a_tool_call_round_trips_with_reasoning_separated(client):
    c, model = client
    first = c.chat.completions.create(model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=240,
                                      reasoning_effort="high", **_extra(CALL)).choices[0]
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert first.message.reasoning_content and first.message.content  # the preamble is content
    assert "<|" not in first.message.content + first.message.reasoning_content
    history = ASK + [first.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    final = c.chat.completions.create(model=model, messages=history, tools=TOOLS, temperature=0, max_tokens=200,
                                      **_extra(FINAL)).choices[0]
    assert final.finish_reason == "stop" and not final.message.tool_calls
    assert final.message.content and final.message.reasoning_content
    assert final.message.content != final.message.reasoning_content
    assert "<|" not in final.message.content + final.message.reasoning_content


def test_the_call_streams_as_the_whole_reply_reads(client):
    c, model = client
    args = dict(model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=240, **_extra(CALL))
    whole = c.chat.completions.create(**args).choices[0].message
    chunks = [ch for ch in c.chat.completions.create(stream=True, **args) if ch.choices]
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    calls = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    assert (reasoning, content) == (whole.reasoning_content, whole.content)
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_forced_tool_choice_is_refused_naming_it(client):
    c, model = client
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        c.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=4)
