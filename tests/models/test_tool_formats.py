"""Every tool-call format: a reply as the family writes it -> the calls (read whole), and the
same reply fed in odd pieces (one character at a time, and at seeded random cuts): the streamed
call_start / call_args pieces concatenated equal each call's name, id and `arguments_json`,
and the content around the calls is the same. Pure text, no model."""
from __future__ import annotations

import json
import random

import pytest

from mlxr.chat.tools import CallSplitter, format_for_template, format_named

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                            "unit": {"type": "string"}}}
TOOLS = {"get_weather": WEATHER, "add": {"type": "object", "properties": {"a": {"type": "number"},
                                                                         "b": {"type": "number"}}},
         "note": {"type": "object", "properties": {"text": {"type": "string"}, "tags": {"type": "array"}}}}
DS = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}<｜tool▁call▁end｜>"

# (format, reply, content, [(name, arguments)])
REPLIES = [
    ("hermes", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1.5e1, "b": -2}}\n</tool_call>',
     "Checking.\n", [("get_weather", {"city": "Paris", "days": 3}), ("add", {"a": 15.0, "b": -2})]),
    ("qwen3_xml", "I will look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
                  "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
     "I will look it up.\n", [("get_weather", {"city": "New York", "days": 2})]),
    ("qwen3_xml", '<tool_call>\n<function=note>\n<parameter=text>\nline one\n"quoted" \\ line two\n</parameter>\n'
                  '<parameter=tags>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n'
                  "<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n</function>\n"
                  "</tool_call>",
     "", [("note", {"text": 'line one\n"quoted" \\ line two', "tags": ["a", "b"]}), ("add", {"a": 1, "b": 2.5})]),
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value>5</arg_value>\n</tool_call>",
     "", [("get_weather", {"city": "Beijing", "days": 5})]),
    ("glm45", "Sure.<tool_call>note\n<arg_key>text</arg_key>\n<arg_value>12</arg_value>\n</tool_call>"
              "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
     "Sure.", [("note", {"text": "12"}), ("add", {"a": 3})]),
    ("kimi_k2", "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "杭州", "unit": "c"}<|tool_call_end|><|tool_call_begin|>'
                'functions.add:1<|tool_call_argument_begin|>{"a":1,"b":2}<|tool_call_end|><|tool_calls_section_end|>',
     "Let me check.", [("get_weather", {"city": "杭州", "unit": "c"}), ("add", {"a": 1, "b": 2})]),
    ("deepseek_v31", "OK" + DS.format("get_weather", '{"city": "Tokyo", "days": 1}')[:-len("<｜tool▁call▁end｜>")]
     + "<｜tool▁call▁end｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 2, \"b\": 3}<｜tool▁call▁end｜>"
     + "<｜tool▁calls▁end｜>", "OK", [("get_weather", {"city": "Tokyo", "days": 1}), ("add", {"a": 2, "b": 3})]),
    ("functiongemma", "<start_function_call>call:get_weather{city:<escape>London, UK<escape>,days:4}"
                      "<end_function_call>", "", [("get_weather", {"city": "London, UK", "days": 4})]),
    ("gemma4", '<|tool_call>call:note{tags:[<|"|>x<|"|>,<|"|>y<|"|>],text:<|"|>a {b} c<|"|>}<tool_call|>',
     "", [("note", {"tags": ["x", "y"], "text": "a {b} c"})]),
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
                '{"name": "add", "arguments": {"a": 1, "b": 1}}]',
     "", [("get_weather", {"city": "Rome"}), ("add", {"a": 1, "b": 1})]),
    ("granite", '[{"name": "add", "arguments": {"a": 0.5, "b": true}}]', "", [("add", {"a": 0.5, "b": True})]),
    ("pythonic", '[get_weather(city="San Francisco", days=7), add(a=1, b=-2.5)]', "",
     [("get_weather", {"city": "San Francisco", "days": 7}), ("add", {"a": 1, "b": -2.5})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 10}}', "",
     [("get_weather", {"city": "Oslo", "days": 10})]),
    ("mistral", '[TOOL_CALLS][{"name": "note", "arguments": {"text": "é\\u00e9 \\"q\\"", "tags": [1, [2, {}]]}}]',
     "", [("note", {"text": 'éé "q"', "tags": [1, [2, {}]]})]),
    ("generic", 'Hm <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> done', "Hm  done",
     [("add", {"a": 1, "b": 2})]),
]


def run(fmt: str, parts: list[str], tools=TOOLS, forced: bool = False, max_calls: int = 64):
    s = CallSplitter(format_named(fmt), forced, tools, max_calls)
    pieces = [p for part in parts for p in s.feed(part)] + s.finish()
    return pieces


def fold(pieces) -> tuple[str, list[tuple[str, str, str]], list]:
    """(content, [(id, name, streamed arguments)] in start order, the whole calls)."""
    content = "".join(p.text for p in pieces if p.kind == "content")
    streamed: dict[str, list] = {}
    for p in pieces:
        if p.kind == "call_start":
            assert p.call.id not in streamed
            streamed[p.call.id] = [p.call.name, ""]
        elif p.kind == "call_args":
            streamed[p.call.id][1] += p.text
    calls = [p.call for p in pieces if p.kind == "call"]
    return content, [(i, n, a) for i, (n, a) in streamed.items()], calls


def cuts(text: str, seed: int) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 13])
        out.append(text[i:i + n])
        i += n
    return out


@pytest.mark.parametrize("fmt,reply,content,calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_whole_reply_gives_the_calls(fmt, reply, content, calls):
    got_content, _, got = fold(run(fmt, [reply]))
    assert got_content == content
    assert [(c.name, c.arguments) for c in got] == calls
    for c in got:
        assert c.cut is None and json.loads(c.arguments_json) == c.arguments


@pytest.mark.parametrize("split", ["chars", "seed1", "seed2", "seed3"])
@pytest.mark.parametrize("fmt,reply,content,calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_streamed_arguments_concatenate_to_the_whole_call(fmt, reply, content, calls, split):
    parts = list(reply) if split == "chars" else cuts(reply, int(split[-1]))
    got_content, streamed, got = fold(run(fmt, parts))
    assert got_content == content
    assert [(c.name, c.arguments) for c in got] == calls
    whole = fold(run(fmt, [reply]))[2]
    assert [c.arguments_json for c in got] == [c.arguments_json for c in whole]
    assert [(c.id, c.name, c.arguments_json) for c in got][:len(streamed)] == streamed
    if split == "chars" and fmt != "pythonic":
        assert len(streamed) == len(calls)  # every call started before it was whole
        assert all(len([p for p in run(fmt, list(reply)) if p.kind == "call_args"]) > len(calls) for _ in [0])


def test_kimi_keeps_the_models_call_ids():
    _, _, calls = fold(run("kimi_k2", list(REPLIES[5][1])))
    assert [c.id for c in calls] == ["functions.get_weather:0", "functions.add:1"]


def test_a_forced_call_streams_its_arguments():
    text = '{"name": "get_weather", "arguments": {"city": "Lima", "days": 12}}'
    content, streamed, calls = fold(run("qwen3_xml", list(text), forced=True))
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Lima", "days": 12})]
    assert streamed == [(calls[0].id, "get_weather", calls[0].arguments_json)]


def test_a_cut_reply_ends_its_started_call_as_far_as_streamed():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nBer"
    content, streamed, calls = fold(run("qwen3_xml", list(text)))
    assert content == "" and calls[0].cut == '{"city": "Ber' == streamed[0][2]


def test_parallel_tool_calls_false_keeps_the_first_call():
    for fmt, reply, _, calls in REPLIES:
        if len(calls) > 1:
            _, streamed, got = fold(run(fmt, list(reply), max_calls=1))
            assert [(c.name, c.arguments) for c in got] == calls[:1], fmt
            assert len(streamed) <= 1


def test_a_call_to_an_unknown_tool_does_not_start_before_it_is_whole():
    reply = '<tool_call>{"name": "nope", "arguments": {"x": 1}}</tool_call>'
    _, streamed, calls = fold(run("hermes", list(reply)))
    assert streamed == [] and [c.name for c in calls] == ["nope"]


TEMPLATES = {  # fragments of the families' own chat templates
    "qwen3_xml": "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + args_name + '>\\n' }}",
    "glm45": "{{- '<tool_call>' + tc.name }}{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key>"
             "<arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>{% if tools %}{% endif %}",
    "kimi_k2": "<|tool_calls_section_begin|>{% for tool_call in message['tool_calls'] %}<|tool_call_begin|>",
    "deepseek_v31": "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>'}}",
    "functiongemma": "{{- '<start_function_call>call:' + function['name'] + '{' -}}",
    "gemma4": "{{- '<|tool_call>call:' + function['name'] + '{' -}}",
    "granite": "<|start_of_role|>assistant<|end_of_role|>{% if tools %}<|tool_call|>{{ message.tool_calls | tojson }}{% endif %}",
    "pythonic": "Use exact format: [func_name1(param1=value1, param2=value2), func_name2(...)] <|eot|> {{ tools }}",
    "hermes": "{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{{ x }}\n</tool_call>",
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_each_format_is_chosen_from_its_template(name):
    assert format_for_template(TEMPLATES[name]).name == name


def test_an_unknown_template_that_renders_calls_gets_its_own_markers():
    template = ("{% for m in messages %}{% if m.tool_calls %}{% for tc in m.tool_calls %}<fn_call>"
                "{{ tc.function | tojson }}</fn_call>{% endfor %}{% endif %}{% endfor %}{{ tools }}")
    fmt = format_for_template(template)
    assert fmt.name == "inferred" and fmt.starts == ("<fn_call>",) and fmt.end == "</fn_call>"
    s = CallSplitter(fmt, tools=TOOLS)
    pieces = [p for ch in 'A<fn_call>{"name": "add", "arguments": {"a": 1}}</fn_call>' for p in s.feed(ch)] + s.finish()
    content, streamed, calls = fold(pieces)
    assert content == "A" and [(c.name, c.arguments) for c in calls] == [("add", {"a": 1})]
    assert streamed[0][2] == calls[0].arguments_json


def test_a_long_call_fed_token_by_token_is_read_in_linear_time():
    """A block being written is read again only as it grows by a part of its length: a 40 kB
    call fed a character at a time (one reading per character took ~50 s) stays well under."""
    import time

    text = "line of code = 1\n" * 2400
    reply = "<tool_call>" + json.dumps({"name": "note", "arguments": {"text": text}}) + "</tool_call>"
    start = time.perf_counter()
    _, streamed, calls = fold(run("hermes", list(reply)))
    assert time.perf_counter() - start < 15
    assert calls[0].arguments == {"text": text} and streamed[0][2] == calls[0].arguments_json
