"""A harmony template's chat plan (server/chat_plan.py) on the harmony fixture's real tokenizer:
reasoning effort into the system message, tools and a tool's result rendered by the template, and
the reply read back by the harmony splitter for every API's reply builder."""
from __future__ import annotations

import pytest

from model_fixtures import FIXTURES
from mlxr.server.chat_plan import plan_chat
from mlxr.server.ollama.replies import whole_message
from mlxr.server.reply_parser import parse_reply

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                    "arguments": '{"city": "Paris"}'}}]}
HISTORY = [{"role": "user", "content": "Weather in Paris?"}, CALL,
           {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]
REPLY = ("<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions.get_weather"
         '<|channel|>commentary json<|message|>{"city": "Paris"}')  # <|call|>, a stop token, is not in the text


@pytest.fixture(scope="module")
def tokenizer():
    from mlxr.testing.gpt_oss_fixtures import harmony_fixture_dir
    from mlxr.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(harmony_fixture_dir(FIXTURES))


@pytest.mark.parametrize(("effort", "written"), [("high", "high"), ("low", "low"), ("minimal", "low"),
                                                 (None, "medium")])
def test_reasoning_effort_goes_into_the_system_message(tokenizer, effort, written):
    plan = plan_chat(tokenizer, HISTORY[:1], None, effort=effort)
    assert plan.harmony and not plan.skip_special_tokens and plan.markers is None
    assert f"Reasoning: {written}\n" in plan.prompt_text


def test_tools_and_the_tools_result_are_rendered_by_the_template(tokenizer):
    text = plan_chat(tokenizer, HISTORY, TOOLS).prompt_text
    assert "namespace functions {\ntype get_weather = (_: {\"type\": \"object\"}) => any;" in text
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            "<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18 C<|end|>"
            "<|start|>assistant") in text


def test_a_reply_ending_at_the_call_stop_token_is_a_call_for_every_api(tokenizer):
    plan = plan_chat(tokenizer, HISTORY[:1], TOOLS)
    reply = parse_reply(plan, REPLY)
    assert reply.reasoning == "Need the tool." and reply.content == ""
    assert [(c.name, c.arguments) for c in reply.calls] == [("get_weather", {"city": "Paris"})]
    ollama = whole_message(plan, REPLY)
    assert ollama["thinking"] == "Need the tool." and ollama["tool_calls"][0]["function"]["name"] == "get_weather"


def test_without_tools_a_call_is_shown_as_text(tokenizer):
    reply = parse_reply(plan_chat(tokenizer, HISTORY[:1], None), REPLY)
    assert not reply.calls and reply.content == '{"city": "Paris"}' and reply.reasoning == "Need the tool."
