"""Chat templates: jinja2 in a sandbox, rendered the way transformers renders them.

Templates come from model files, so they are untrusted code: they run in jinja2's immutable
sandbox with caps on output size, intermediate string sizes, `range` lengths and time.
"""
from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mlxr.errors import MLXRError, TemplateError

MAX_OUTPUT_CHARS = 1_000_000  # rendered prompt, and any string or list built on the way
MAX_RANGE = 100_000  # one range() call
MAX_RANGE_TOTAL = 1_000_000  # all range() items of one render
MAX_SECONDS = 10.0


@dataclass
class _Budget:
    deadline: float
    range_left: int = MAX_RANGE_TOTAL

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"chat template took longer than {MAX_SECONDS:g} s to render")


_BUDGET: ContextVar[_Budget | None] = ContextVar("mlxr_template_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    # Outside ChatTemplate.render (not expected) each check gets a fresh, still bounded budget.
    return budget if budget is not None else _Budget(time.monotonic() + MAX_SECONDS)


def _check_length(length: int, what: str) -> None:
    if length > MAX_OUTPUT_CHARS:
        raise TemplateError(f"chat template built a {what} longer than {MAX_OUTPUT_CHARS}")


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, (str, list, tuple, dict)):
        _check_length(len(value), what)
    return value


# Callables whose integer arguments size their result: " "|center(10**9) or "x".ljust(10**9)
# would allocate before any check of the result could run.
_SIZING_CALLABLES = frozenset(
    {"center", "ljust", "rjust", "zfill", "expandtabs", "indent", "wordwrap", "truncate", "batch", "slice"}
)


def _check_args(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    if name not in _SIZING_CALLABLES:
        return
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > MAX_OUTPUT_CHARS:
            raise TemplateError(f"chat template passed {value} to a function (limit {MAX_OUTPUT_CHARS})")


class _LimitedCodeGenerator(CodeGenerator):
    """Routes `a ~ b` through the environment so concatenation is size-checked."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; a no-op here."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _SandboxEnvironment(ImmutableSandboxedEnvironment):
    code_generator_class = _LimitedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        _budget().check_time()
        if operator == "**" and isinstance(right, int) and abs(right) > 4096:
            raise TemplateError("chat template raised a number to a huge power")
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int):
                    _check_length(len(seq) * count, "repetition")
        return _check_size(super().call_binop(context, operator, left, right), "value")

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _budget().check_time()
        _check_args(getattr(__obj, "__name__", ""), args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_size(result, "value")

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # jinja would return an Undefined that prints as ""; failing loudly is clearer.
        raise jinja2.sandbox.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed"
        )

    def checked_concat(self, parts: Sequence[Any]) -> str:
        _budget().check_time()
        strings = [str(p) for p in parts]
        _check_length(sum(map(len, strings)), "string")
        return "".join(strings)


def _limited_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)  # keeps jinja's pass_context/pass_environment marker
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _check_args(name, args[1:], kwargs)
        return _check_size(fn(*args, **kwargs), "value")

    return wrapper


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template raised: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Unlike jinja's own tojson: no HTML escaping, and the options transformers exposes.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _limited_range(*args: int) -> range:
    r = range(*args)
    budget = _budget()
    if len(r) > MAX_RANGE:
        raise TemplateError(f"chat template range has {len(r)} items (limit {MAX_RANGE})")
    if len(r) > budget.range_left:
        raise TemplateError(f"chat template loops over more than {MAX_RANGE_TOTAL} range items")
    budget.range_left -= len(r)
    return r


def _make_dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
    return dict(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def _environment() -> _SandboxEnvironment:
    env = _SandboxEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag]
    )
    env.filters = {name: _limited_filter(name, f) for name, f in env.filters.items()}
    env.filters["tojson"] = _limited_filter("tojson", _tojson)
    env.globals.pop("lipsum", None)
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now,
        range=_limited_range, dict=_make_dict,
    )
    return env


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template syntax error (line {e.lineno}): {e.message}") from e


class ChatTemplate:
    """A compiled chat template. Construction raises TemplateError on a syntax error."""

    def __init__(self, source: str) -> None:
        if not isinstance(source, str):
            raise TemplateError("chat template must be a string")
        self.source = source
        self._template = _compile(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """Render `messages`; `variables` carries bos_token, eos_token and template kwargs."""
        context = {
            **{k: _plain(v) for k, v in variables.items()},
            "messages": _plain(list(messages)),
            "tools": _plain(list(tools)) if tools is not None else None,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        token = _BUDGET.set(_Budget(time.monotonic() + MAX_SECONDS))
        try:
            return _collect(self._template.generate(**context))
        except MLXRError:
            raise
        except Exception as e:  # anything a template does wrong is the template's error
            raise TemplateError(f"chat template error: {_describe(e)}") from e
        finally:
            _BUDGET.reset(token)


def _collect(chunks: Iterator[str]) -> str:
    out: list[str] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_OUTPUT_CHARS:
            raise TemplateError(f"chat template output is longer than {MAX_OUTPUT_CHARS} characters")
        out.append(chunk)
    return "".join(out)


def _describe(e: Exception) -> str:
    message = getattr(e, "message", None) or str(e)
    return message if isinstance(e, jinja2.TemplateError) else f"{type(e).__name__}: {message}"


def _plain(value: Any) -> Any:
    """A copy made of JSON types only, so templates never see objects with unsafe methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, (str, int, float)):  # subclasses may carry extra methods
        return _base_scalar(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TemplateError(f"chat template input holds an unsupported {type(value).__name__} value")


def _base_scalar(value: str | int | float) -> str | int | float:
    for base in (bool, str, int, float):
        if isinstance(value, base):
            return base(value)
    raise AssertionError(type(value))


def render_chat_template(source: str, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> str:
    """Compile (cached) and render in one call."""
    return ChatTemplate(source).render(messages, **kwargs)


# Gemma's turn format: system text folded into the first turn, "assistant" called "model",
# content trimmed, and strictly alternating user/model turns.
GEMMA_TEMPLATE = """{{- bos_token -}}
{%- set ns = namespace(prefix='', turns=messages) -%}
{%- macro text_of(content) -%}
{%- if content is string -%}{{ content }}
{%- else -%}{%- for part in content if part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set ns.prefix = text_of(messages[0]['content']) ~ '\n\n' -%}
{%- set ns.turns = messages[1:] -%}
{%- endif -%}
{%- for message in ns.turns -%}
{%- set expected = 'user' if loop.index0 % 2 == 0 else 'assistant' -%}
{%- if message['role'] != expected -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{{- '<start_of_turn>' ~ ('model' if message['role'] == 'assistant' else 'user') ~ '\n' -}}
{%- if loop.first -%}{{ ns.prefix }}{%- endif -%}
{%- if message['content'] is string -%}{{ message['content'] | trim }}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}
{%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}
"""

CHATML_TEMPLATE = """{%- for message in messages -%}
{{- '<|im_start|>' ~ message['role'] ~ '\n' -}}
{%- if message['content'] is string -%}{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] if part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}
"""

_DEFAULTS: dict[str, str] = {
    "gemma": GEMMA_TEMPLATE, "gemma2": GEMMA_TEMPLATE, "gemma3": GEMMA_TEMPLATE,
    "gemma3_text": GEMMA_TEMPLATE,
    "qwen2": CHATML_TEMPLATE, "qwen2moe": CHATML_TEMPLATE, "qwen2_moe": CHATML_TEMPLATE,
    "qwen3": CHATML_TEMPLATE, "qwen3moe": CHATML_TEMPLATE, "qwen3_moe": CHATML_TEMPLATE,
}


def default_template_for(architecture: str) -> str | None:
    """The built-in template for a model family whose files carry none (None if we have none)."""
    return _DEFAULTS.get(architecture.lower())
