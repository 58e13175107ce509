"""The Ollama layer's pure parts: keep_alive durations, options mapping, Go template subset."""
from __future__ import annotations

import pytest

from mlxr.errors import ContextLengthError, InvalidParameterError
from mlxr.server.ollama.durations import FOREVER, parse_keep_alive, rfc3339
from mlxr.server.ollama.options import Options, context_window, max_tokens, sampling_params
from mlxr.server.ollama.prompts import render_go_template


@pytest.mark.parametrize("value, seconds", [
    (None, None), ("5m", 300.0), ("1h30m", 5400.0), ("10s", 10.0), ("1.5s", 1.5), ("300ms", 0.3),
    ("0", 0.0), (0, 0.0), (30, 30.0), (2.5, 2.5), ("90", 90.0), (-1, FOREVER), ("-1m", FOREVER),
    ("-1", FOREVER),
])
def test_keep_alive(value, seconds) -> None:
    assert parse_keep_alive(value) == (None if seconds is None else pytest.approx(seconds))


@pytest.mark.parametrize("value", ["", "5 minutes", "m5", "1h-3m", "inf", True])
def test_keep_alive_invalid(value) -> None:
    with pytest.raises(InvalidParameterError) as e:
        parse_keep_alive(value)
    assert e.value.param == "keep_alive"


def test_rfc3339_has_z() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000000Z"


def test_num_ctx_and_num_predict() -> None:
    assert context_window(None, 256) == 256
    assert context_window(Options(num_ctx=100), 256) == 100
    assert context_window(Options(num_ctx=4096), 256) == 256  # clamped, logged
    assert max_tokens(None, 10, 256, "prompt") == 246
    assert max_tokens(Options(num_predict=-2), 10, 100, "prompt") == 90
    assert max_tokens(Options(num_predict=5), 10, 100, "prompt") == 5
    assert max_tokens(Options(num_predict=500), 10, 100, "prompt") == 90
    with pytest.raises(ContextLengthError) as e:
        max_tokens(None, 300, 256, "messages")
    assert e.value.param == "messages" and "300" in e.value.message and "256" in e.value.message
    with pytest.raises(InvalidParameterError, match="options.num_predict"):
        max_tokens(Options(num_predict=0), 10, 100, "prompt")


def test_num_predict_unset_takes_the_servers_default_within_the_window() -> None:
    assert max_tokens(None, 10, 256, "prompt", default=64) == 64
    assert max_tokens(Options(), 200, 256, "prompt", default=64) == 56  # the window's remainder
    assert max_tokens(Options(num_predict=100), 10, 256, "prompt", default=64) == 100  # the request wins
    assert max_tokens(Options(num_predict=-1), 10, 256, "prompt", default=64) == 246
    assert max_tokens(None, 10, 256, "prompt", default=0) == 246  # 0: no bound


def test_sampling_params_defaults_and_names() -> None:
    p = sampling_params(None, 7)
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.repetition_penalty) == (7, 0.8, 40, 0.9, 1.1)
    p = sampling_params(Options(seed=-1, stop="x", repeat_penalty=1.0, temperature=0), 3)
    assert p.seed is None and p.stop == ["x"] and p.repetition_penalty == 1.0 and p.greedy
    with pytest.raises(InvalidParameterError) as e:
        sampling_params(Options(repeat_penalty=-1.0), 3)
    assert e.value.param == "options.repeat_penalty"


def test_options_are_strictly_typed_and_open() -> None:
    with pytest.raises(ValueError):
        Options.model_validate({"temperature": "hot"})
    with pytest.raises(ValueError):
        Options.model_validate({"num_predict": 1.5})
    with pytest.raises(ValueError):
        Options.model_validate({"num_ctx": True})
    assert Options.model_validate({"num_predict": 4.0, "seed": -1.0}).num_predict == 4
    o = Options.model_validate({"temperature": 1, "mystery": 3})
    assert o.temperature == 1.0 and o.model_extra == {"mystery": 3}


def test_go_template_subset() -> None:
    t = "{{ if .System }}<s>{{ .System }}</s>\n{{ end }}U: {{ .Prompt }}\nA: {{ .Response }}<end>"
    assert render_go_template(t, "sys", "hi") == "<s>sys</s>\nU: hi\nA: "
    assert render_go_template(t, "", "hi") == "U: hi\nA: "
    assert render_go_template("U: {{- .Prompt -}}  \nA:", "", "hi") == "U:hiA:"
    with pytest.raises(InvalidParameterError, match="template"):
        render_go_template("{{ range .Messages }}{{ end }}", "", "")
