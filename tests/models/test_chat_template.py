"""Chat templates: parity with transformers, errors, sandbox limits, built-in defaults."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from mlxr.chat.template import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    ChatTemplate,
    default_template_for,
)
from mlxr.errors import TemplateError
from mlxr.tokenizer.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

# A template in the style of tool-calling templates: namespace, slicing, tojson(indent),
# loop controls, filters, whitespace control and a {% generation %} block.
TOOLS_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system='') -%}
{%- if messages[0]['role'] == 'system' %}{% set ns.system = messages[0]['content'] %}{% set messages = messages[1:] %}{% endif %}
{%- if tools %}
<|system|>{{ ns.system }}
You may call these tools:
{% for tool in tools %}{{ tool | tojson(indent=2) }}
{% endfor %}
{%- elif ns.system %}<|system|>{{ ns.system | trim }}
{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'skip' %}{% continue %}{% endif %}
<|{{ message['role'] }}|>
{%- if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}
{%- else %}{{ message['content'] }}{% endif %}
{%- if message.tool_calls is defined %}{% for call in message.tool_calls %}
<tool_call>{{ call | tojson }}</tool_call>{% endfor %}{% endif %}
{{ eos_token }}
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"""

RAISING_TEMPLATE = """{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('Unknown role: ' ~ m['role']) }}{% endif %}{{ m['content'] }}{% endfor %}"""

CONVERSATION = [
    {"role": "system", "content": "  You are terse. Ünïcödé ok 日本  "},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": "é"}}]},
    {"role": "skip", "content": "hidden"},
    {"role": "user", "content": "And 3+3?\n"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add. ✓",
                                            "parameters": {"type": "object", "properties": {}}}}]


def _make_tokenizer_dir(path: Path, template: str | None, **config: Any) -> Path:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_end|>": 3, "hi": 4}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", "<|im_end|>")])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", **config}
    if template is not None:
        cfg["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path


def _hf_render(path: Path, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    hf = transformers.AutoTokenizer.from_pretrained(path)
    return hf.apply_chat_template(messages, tokenize=False, **kwargs)


@pytest.mark.parametrize("template", [TOOLS_TEMPLATE, GEMMA_TEMPLATE, CHATML_TEMPLATE])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_rendering_matches_transformers(tmp_path: Path, template: str, generation_prompt: bool) -> None:
    path = _make_tokenizer_dir(tmp_path / "tok", template)
    ours = Tokenizer.from_hf_dir(path)
    messages = CONVERSATION if template is TOOLS_TEMPLATE else [
        m for m in CONVERSATION if m["role"] in ("system", "user", "assistant")
    ]
    for kwargs in ({}, {"tools": TOOLS}, {"tools": TOOLS, "enable_thinking": False}):
        if template is GEMMA_TEMPLATE and kwargs:
            continue
        want = _hf_render(path, messages, add_generation_prompt=generation_prompt, **kwargs)
        got = ours.apply_chat_template(messages, add_generation_prompt=generation_prompt, **kwargs)
        assert got == want


def test_gemma_default_template_format() -> None:
    messages = [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": " Arr, hello. "},
        {"role": "user", "content": [{"type": "text", "text": "Where is the treasure?"}]},
    ]
    got = ChatTemplate(GEMMA_TEMPLATE).render(messages, bos_token="<bos>")
    assert got == (
        "<bos><start_of_turn>user\nYou are a pirate.\n\nHello!<end_of_turn>\n"
        "<start_of_turn>model\nArr, hello.<end_of_turn>\n"
        "<start_of_turn>user\nWhere is the treasure?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    with pytest.raises(TemplateError, match="alternate"):
        ChatTemplate(GEMMA_TEMPLATE).render([{"role": "assistant", "content": "x"}], bos_token="")


def test_defaults_by_architecture() -> None:
    assert default_template_for("gemma3") is GEMMA_TEMPLATE
    assert default_template_for("Gemma2") is GEMMA_TEMPLATE
    assert default_template_for("qwen2") is CHATML_TEMPLATE
    assert default_template_for("llama") is None
    rendered = ChatTemplate(CHATML_TEMPLATE).render([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_default_is_logged_and_only_used_without_a_template(tmp_path: Path, caplog: Any) -> None:
    path = _make_tokenizer_dir(tmp_path / "gemma", None)
    (path / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    with caplog.at_level(logging.INFO, logger="mlxr.tokenizer.tokenizer"):
        tok = Tokenizer.from_hf_dir(path)
    assert "built-in" in caplog.text and tok.chat_template is None
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).startswith("<s><start_of_turn>")
    broken = _make_tokenizer_dir(tmp_path / "broken", "{{ raise_exception('nope') }}")
    (broken / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    with pytest.raises(TemplateError, match="nope"):  # an error never falls back to the default
        Tokenizer.from_hf_dir(broken).apply_chat_template([{"role": "user", "content": "hi"}])
    plain = Tokenizer.from_hf_dir(_make_tokenizer_dir(tmp_path / "plain", None))
    with pytest.raises(TemplateError, match="no chat template"):
        plain.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_sources_and_eos_from_generation_config(tmp_path: Path) -> None:
    path = _make_tokenizer_dir(tmp_path / "t", "from config", add_bos_token=True)
    (path / "chat_template.jinja").write_text("from jinja file {{ bos_token }}")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    tok = Tokenizer.from_hf_dir(path)
    assert tok.apply_chat_template([]) == "from jinja file <s>"
    assert tok.stop_token_ids == frozenset({2, 3})
    assert tok.encode("hi") == [1, 4] and tok.encode("hi", add_special_tokens=False) == [4]
    named = _make_tokenizer_dir(tmp_path / "n", [{"name": "tool_use", "template": "T"},
                                                 {"name": "default", "template": "D"}])
    assert Tokenizer.from_hf_dir(named).apply_chat_template([]) == "D"


def test_raise_exception_is_a_template_error() -> None:
    template = ChatTemplate(RAISING_TEMPLATE)
    assert template.render([{"role": "user", "content": "ok"}]) == "ok"
    with pytest.raises(TemplateError, match="Unknown role: robot"):
        template.render([{"role": "robot", "content": "beep"}])


@pytest.mark.parametrize("source", ["{% for m in messages %}", "{{ messages[0 }}", "{% endif %}"])
def test_syntax_error_is_a_template_error(source: str) -> None:
    with pytest.raises(TemplateError, match="syntax"):
        ChatTemplate(source)


def test_undefined_behaves_like_transformers() -> None:
    assert ChatTemplate("[{{ nothing }}]").render([]) == "[]"
    with pytest.raises(TemplateError):
        ChatTemplate("{{ nothing.attr.deeper }}").render([])
    with pytest.raises(TemplateError):
        ChatTemplate("{{ 1 + 'a' }}").render([])


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ messages.__class__.__base__ }}",
        "{{ raise_exception.__globals__ }}",
        "{% set x = [] %}{{ x.append(1) }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ dict.__call__ }}",
    ],
)
def test_sandbox_blocks_unsafe_access(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x' * 10000000 }}",
        "{{ ['x'] * 10000000 }}",
        "{{ 10 ** 100000 }}",
        "{{ ' ' | center(1000000000) }}",
        "{{ 'x'.ljust(1000000000) }}",
        "{% for i in range(10000000) %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{% for i in range(100000) %}{{ 'abcdefghijklmnop' }}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    ],
)
def test_sandbox_limits(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([])


def test_tojson_and_helpers() -> None:
    out = ChatTemplate("{{ x | tojson }}|{{ x | tojson(indent=2) }}").render([], x={"k": "é<"})
    assert out == '{"k": "é<"}|{\n  "k": "é<"\n}'
    year = ChatTemplate("{{ strftime_now('%Y') }}").render([])
    assert year.isdigit() and len(year) == 4
    loop = "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    assert ChatTemplate(loop).render([]) == "012"


BIG = "{% set s = 'x' * 1000000 %}"
# Issue #16 D2: each ran for ever or built gigabytes in one operation, between the deadline's checks.
RUNAWAY = [
    BIG + "{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "{{ ((2**4000)**4000)**4000 }}",
    "{{ '%01000000000d' % 1 }}",
    "{{ '%01000000000d' | format(1) }}",
    "{{ '%*d' % (1000000000, 1) }}",
    "{{ '{:01000000000d}'.format(1) }}",
    "{{ '{:{w}d}'.format(1, w=1000000000) }}",
    BIG + "{{ ([s] * 1000000) | join }}",
    BIG + "{{ s.join([s] * 1000000) }}",
    BIG + "{{ s.replace('x', s) }}",
    BIG + "{{ s | replace('x', s) }}",
    "{{ ('\n' * 1000000) | indent(999999) }}",
    BIG + "{% for a in s if a == 'y' %}{% endfor %}{% for a in s if a == 'y' %}{% endfor %}",
    "{% set ns = namespace(x=2**4000) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    # Each value within limits, together 90 GB: the budget on everything built stops it.
    "{% set h = 'x' * 900000 %}{% set ns = namespace(l=[]) %}"
    "{% for i in range(100000) %}{% set ns.l = ns.l + [h ~ i] %}{% endfor %}",
    BIG + "{% for a in [1, 2] recursive %}{% for b in s %}{{ loop(s) if false }}{% endfor %}{% endfor %}",
]


@pytest.mark.parametrize("source", RUNAWAY)
def test_runaway_templates_fail_fast(source: str) -> None:
    import time

    t0 = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([])
    assert time.monotonic() - t0 < 6.0  # the 5 s deadline at worst, most stop far sooner


def test_budget_leaves_ordinary_work_alone() -> None:
    long = "word " * 150_000  # 750,000 characters, under the 1,000,000 output limit
    out = ChatTemplate(CHATML_TEMPLATE).render([{"role": "user", "content": long}] * 1)
    assert long in out
    loop = "{% for m in messages %}{% for c in m['content'] %}{% endfor %}{{ loop.length }}{% endfor %}"
    assert ChatTemplate(loop).render([{"role": "user", "content": "abc"}]) == "1"
    fmt = "{{ '%05d|%-6s|' % (42, 'ab') }}{{ '{:>4}'.format(7) }}{{ ['a', 'b'] | join(', ') }}"
    assert ChatTemplate(fmt).render([]) == "00042|ab    |   7a, b"
