"""Every tool-call format: a reply as the family writes it -> the calls (read whole), and the
same reply fed in odd pieces (one character at a time, and at seeded random cuts): the streamed
call_start / call_args pieces concatenated equal each call's name, id and `arguments_json`,
and the content around the calls is the same. Pure text, no model."""
from __future__ import annotations

import json
import random

import pytest

from mlxr.chat.tools import CallSplitter, format_for_template, format_named
from tool_replies import REPLIES, TEMPLATES, TOOLS

def tool_format(fmt: str):
    """The format by name; the inferred one exists only as read from its template."""
    return format_for_template(TEMPLATES[fmt]) if fmt == "inferred" else format_named(fmt)


def run(fmt: str, parts: list[str], tools=TOOLS, forced: bool = False, max_calls: int = 64):
    s = CallSplitter(tool_format(fmt), forced, tools, max_calls)
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


def test_pythonic_calls_only_open_the_reply():
    s = CallSplitter(format_named("pythonic"), tools=TOOLS)
    fed = [p for ch in "See [1] and [add(a=1)] here." for p in s.feed(ch)]
    assert "".join(p.text for p in fed) == "See [1] and [add(a=1)] here."  # streamed, never held
    assert not [p for p in fed + s.finish() if p.kind.startswith("call")]
    s = CallSplitter(format_named("pythonic"), tools=TOOLS)
    pieces = [p for ch in '  [add(a=1, b=2)]' for p in s.feed(ch)] + s.finish()
    assert [(p.call.name, p.call.arguments) for p in pieces if p.kind == "call"] == [("add", {"a": 1, "b": 2})]


def test_past_calls_reach_each_template_as_it_joins_them():
    """DeepSeek V3.1's template joins a past call's arguments as text ('<｜tool▁sep｜>' + arguments):
    it gets JSON text; templates that iterate the arguments (Qwen3-Coder's |items) get an object.
    The rendered past call reads back as the same call."""
    from mlxr.chat.template import render_chat_template
    from mlxr.chat.tools import template_messages

    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'}}]}]
    deepseek = ("{% for m in messages %}{% if m.tool_calls %}{% for t in m.tool_calls %}"
                "{{ '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + t['function']['name'] + '<｜tool▁sep｜>' "
                "+ t['function']['arguments'] + '<｜tool▁call▁end｜><｜tool▁calls▁end｜>' }}{% endfor %}"
                "{% else %}{{ m.content }}{% endif %}{% endfor %}{{ tools | length }}")
    qwen = ("{% for m in messages %}{% if m.tool_calls %}{% for t in m.tool_calls %}<tool_call>\n<function="
            "{{ t.function.name }}>\n{% for k, v in t.function.arguments|items %}<parameter={{ k }}>\n{{ v }}\n"
            "</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
            "{% endfor %}{{ tools | length }}")
    for template, marker in ((deepseek, "<｜tool▁calls▁begin｜>"), (qwen, "<tool_call>")):
        fmt = format_for_template(template)
        messages, tools = template_messages(history, fmt, [{"type": "function", "function": {"name": "get_weather"}}])
        text = render_chat_template(template, messages, tools=tools, bos_token="")
        pieces = run(fmt.name, list(text.split("weather?", 1)[1]))
        assert [(p.call.name, p.call.arguments) for p in pieces if p.kind == "call"] == \
            [("get_weather", {"city": "Oslo", "days": 2})], (fmt.name, text)
