"""Tool-call formats, the call and reasoning splitters, and tool turns in every built-in
template: pure text in, pieces out (no model)."""
from __future__ import annotations

import json

import pytest

from mlxr.chat.reasoning import ReasoningSplitter, markers_for_template
from mlxr.chat.template import CHATML_TEMPLATE, GEMMA_TEMPLATE, render_chat_template
from mlxr.chat.tools import CallSplitter, format_for_template, format_named, registered, template_messages

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def split(fmt_name: str, text: str, chunked: bool, forced: bool = False):
    s = CallSplitter(format_named(fmt_name), forced)
    pieces = []
    for part in (list(text) if chunked else [text]):
        pieces += s.feed(part)
    pieces += s.finish()
    content = "".join(p.text for p in pieces if p.kind == "content")
    return content, [(p.call.name, p.call.arguments) for p in pieces if p.kind == "call"]


CASES = [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me look.\n", [("get_weather", {"city": "Paris"})]),
    ("generic", '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, 2]}}]</tool_call>',
     "", [("a", {}), ("b", {"x": [1, 2]})]),
    ("generic", '<tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>\n<tool_call>{"name": "c", '
     '"arguments": {}}</tool_call>\n', "", [("a", {"k": 1}), ("c", {})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {}}', "", [("f", {})]),
    ("mistral", '[{"name": "f", "arguments": {"q": "é"}}, {"name": "g", "arguments": {}}]', "",
     [("f", {"q": "é"}), ("g", {})]),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}}]', "", [("f", {})]),
    # malformed or plain: content, never a crash
    ("hermes", "<tool_call>{not json}</tool_call> after", "<tool_call>{not json}</tool_call> after", []),
    # a call whose arguments began streams from there: a reply cut inside it ends it as a cut call
    ("hermes", '<tool_call>{"name": "f", "arguments": {', "", [("f", {})]),
    ("hermes", '<tool_call>{"name": "f", "argu', '<tool_call>{"name": "f", "argu', []),
    ("hermes", 'a <tool_ca', "a <tool_ca", []),
    ("generic", '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ("llama3_json", '{"name": "f", "parameters": ', '{"name": "f", "parameters": ', []),
    ("llama3_json", '{"answer": 42} is JSON', '{"answer": 42} is JSON', []),
    ("mistral", "[1, 2] and text", "[1, 2] and text", []),
    ("llama3_json", "plain words", "plain words", []),
]


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_formats_split_calls_from_content(fmt, text, content, calls, chunked):
    assert split(fmt, text, chunked) == (content, calls)


def test_forced_reply_is_a_bare_call_or_list():
    assert split("generic", '{"name": "f", "arguments": {"a": 1}}', True, forced=True) == ("", [("f", {"a": 1})])
    assert split("hermes", '[{"name": "f", "arguments": {}}]', False, forced=True) == ("", [("f", {})])
    assert split("hermes", '{"na', False, forced=True) == ('{"na', [])  # cut before a name: content


@pytest.mark.parametrize("text, calls", [
    ('{"name": "f", "argu', [("f", "")]),
    ('{"name": "get_weather", "arguments": {"city": "Par', [("get_weather", '{"city": "Par')]),
    ('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1', [("a", "{}"), ("b", '{"x": 1')]),
    ('[{"name": "a", "arguments": {"k": 2}}, {"na', [("a", '{"k": 2}')]),
])
def test_a_forced_reply_cut_off_gives_its_calls_as_far_as_written(text, calls):
    """max_tokens cut the call: the name and the arguments' partial text, as OpenAI gives them."""
    s = CallSplitter(format_named("hermes"), forced=True)
    pieces = s.feed(text) + s.finish()
    assert [(p.call.name, p.call.arguments_json) for p in pieces if p.kind == "call"] == calls
    assert not [p for p in pieces if p.kind == "content"]


def test_call_ids_are_unique_and_arguments_json_round_trips():
    s = CallSplitter(format_named("generic"))
    pieces = s.feed('<tool_call>[{"name": "a", "arguments": {"u": "ü"}}, {"name": "a", "arguments": {}}]</tool_call>')
    ids = [p.call.id for p in pieces]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert json.loads(pieces[0].call.arguments_json) == {"u": "ü"}


def test_format_chosen_from_the_template():
    qwen = "{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{{ x }}\n</tool_call>"
    llama = "<|start_header_id|>ipython<|end_header_id|> {{ tools }} <|eot_id|>"
    mistral = "[AVAILABLE_TOOLS] {{ tools }} [/AVAILABLE_TOOLS][TOOL_CALLS]"
    assert format_for_template(qwen).name == "hermes"
    assert format_for_template(llama).name == "llama3_json"
    assert format_for_template(mistral).name == "mistral"
    for plain in (GEMMA_TEMPLATE, CHATML_TEMPLATE, None):
        assert format_for_template(plain).name == "generic"
    assert {"hermes", "llama3_json", "mistral", "generic"} <= {f.name for f in registered()}


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "4 C"},
]

SMOLLM2_TEMPLATE = (  # the template inside SmolLM2-135M-Instruct's GGUF
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.mark.parametrize("template", [GEMMA_TEMPLATE, CHATML_TEMPLATE, SMOLLM2_TEMPLATE])
def test_tool_turns_render_in_every_built_in_template(template):
    fmt = format_for_template(template)
    messages, tools = template_messages(CONVERSATION, fmt, [WEATHER])
    text = render_chat_template(template, messages, tools=tools, bos_token="<bos>")
    assert '"name": "get_weather"' in text and "<tools>" in text  # the tools, in the system turn
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' in text
    assert "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n4 C\n</tool_response>" in text


def test_gemma_without_tools_still_renders_a_tool_result():
    messages, _ = template_messages(CONVERSATION[1:], format_for_template(GEMMA_TEMPLATE), None)
    text = render_chat_template(GEMMA_TEMPLATE, messages, bos_token="<bos>")
    assert text.endswith("</tool_response><end_of_turn>\n<start_of_turn>model\n")


THINK = "<think>\nThe user greets.\n</think>\n\nHello!"


@pytest.mark.parametrize("chunked", [False, True])
def test_reasoning_split(chunked):
    markers = markers_for_template("{% if enable_thinking %}<think>\n\n</think>{% endif %}")
    s = ReasoningSplitter(markers, "<|im_start|>assistant\n")
    pieces = []
    for part in (list(THINK) if chunked else [THINK]):
        pieces += s.feed(part)
    pieces += s.finish()
    assert "".join(p.text for p in pieces if p.kind == "reasoning") == "\nThe user greets.\n"
    assert "".join(p.text for p in pieces if p.kind == "content") == "Hello!"


def test_reasoning_opened_by_the_prompt_and_cut_off():
    markers = markers_for_template("</think>")
    s = ReasoningSplitter(markers, "<|Assistant|><think>\n")
    assert [(p.kind, p.text) for p in s.feed("still thinking") + s.finish()] == [("reasoning", "still thinking")]
    s = ReasoningSplitter(markers, "x")
    assert [(p.kind, p.text) for p in s.feed("no <think> here") + s.finish()] == [("content", "no <think> here")]
    assert markers_for_template(GEMMA_TEMPLATE) is None


def test_ollama_message_shape_read_by_the_official_client():
    import ollama

    from mlxr.server.chat_plan import ChatPlan
    from mlxr.server.ollama.replies import StreamedMessage, whole_message

    plan = ChatPlan(fmt=format_named("generic"), markers=markers_for_template("</think>"), prompt_text="x")
    text = '<think>hm</think>\n\nOK <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    whole = ollama.Message(**whole_message(plan, text))
    assert whole.thinking == "hm" and whole.content == "OK "
    assert whole.tool_calls[0].function.name == "get_weather"
    assert whole.tool_calls[0].function.arguments == {"city": "Rome"}  # an object, not JSON text
    stream = StreamedMessage(plan)
    chunks = [stream.delta(ch, False) for ch in text] + [stream.delta("", True)]
    parts = [ollama.Message(**c) for c in chunks if c is not None]
    assert "".join(p.thinking or "" for p in parts) == "hm" and "".join(p.content for p in parts) == "OK "
    assert [c.function.arguments for p in parts for c in p.tool_calls or []] == [{"city": "Rome"}]
