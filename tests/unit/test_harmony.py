"""The harmony reply splitter (mlxr/chat/harmony.py) on gpt-oss replies as its format writes
them: channels to reasoning, content and calls, whatever the chunking."""
from __future__ import annotations

import pytest

from mlxr.chat.harmony import HarmonySplitter, template_is_harmony

# A reply after a prompt ending in <|start|>assistant: thinking, a preamble, then a call.
CALL_REPLY = ("<|channel|>analysis<|message|>User asks weather in Paris. Need to call get_weather.<|end|>"
              "<|start|>assistant<|channel|>commentary<|message|>Checking the forecast.<|end|>"
              "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
              '<|message|>{"city": "Paris", "unit": "celsius"}<|call|>')
# After the tool's result: more thinking, then the answer.
FINAL_REPLY = ("<|channel|>analysis<|message|>The tool says 18 C and sunny.<|end|>"
               "<|start|>assistant<|channel|>final<|message|>It is 18 °C and sunny in Paris.<|return|>")
# The recipient before the channel, as the format also allows.
RECIPIENT_FIRST = ('<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant to=functions.a'
                   '<|channel|>commentary json<|message|>{"x": 1}<|call|><|start|>assistant to=functions.b'
                   '<|channel|>commentary json<|message|>{}<|call|>')


def split(text: str, chunk: int | None = None) -> list[tuple]:
    s = HarmonySplitter()
    pieces = []
    for i in range(0, len(text), chunk or len(text)):
        pieces += s.feed(text[i:i + (chunk or len(text))])
    pieces += s.finish()
    merged: list[tuple] = []
    for p in pieces:  # a stream's pieces of one kind, joined
        if p.kind == "call":
            merged.append(("call", p.call.name, p.call.arguments))
        elif merged and merged[-1][0] == p.kind:
            merged[-1] = (p.kind, merged[-1][1] + p.text)
        else:
            merged.append((p.kind, p.text))
    return merged


def test_a_call_reply():
    assert split(CALL_REPLY) == [("reasoning", "User asks weather in Paris. Need to call get_weather."),
                                 ("content", "Checking the forecast."),
                                 ("call", "get_weather", {"city": "Paris", "unit": "celsius"})]


def test_the_final_answer_after_the_tool_result():
    assert split(FINAL_REPLY) == [("reasoning", "The tool says 18 C and sunny."),
                                  ("content", "It is 18 °C and sunny in Paris.")]


def test_recipient_before_the_channel_and_two_calls():
    assert split(RECIPIENT_FIRST) == [("reasoning", "Two calls."), ("call", "a", {"x": 1}), ("call", "b", {})]


@pytest.mark.parametrize("text", [CALL_REPLY, FINAL_REPLY, RECIPIENT_FIRST])
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 16])
def test_the_split_does_not_depend_on_the_chunking(text, chunk):
    assert split(text, chunk) == split(text)


def test_reasoning_streams_before_its_end_marker():
    s = HarmonySplitter()
    pieces = s.feed("<|channel|>analysis<|message|>thinking about it<|e")
    assert [(p.kind, p.text) for p in pieces] == [("reasoning", "thinking about it")]


def test_a_call_cut_off_or_not_json_falls_back_to_content():
    assert split('<|channel|>commentary to=functions.f json<|message|>{"x": ') == [("content", '{"x": ')]
    assert split("<|channel|>commentary to=functions.f json<|message|>not json<|call|>") == [("content", "not json")]


def test_text_that_is_not_harmony_is_content():
    assert split("Just an answer.") == [("content", "Just an answer.")]
    long = "x" * 600
    assert split(long, 50) == [("content", long)]


def test_recognises_the_gpt_oss_template():
    assert template_is_harmony("{{- '<|channel|>analysis<|message|>' }}...{{- '<|call|>' }}")
    assert not template_is_harmony("{{ '<think>' }}")
