"""The pure parts of a first run: the default reply bound, the start-up banner, whether a model
carries its own chat template."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from mlxr.server.banner import READY, banner_lines, base_url
from mlxr.server.ollama.model_info import template_origin
from mlxr.server.reply_budget import DEFAULT_MAX_TOKENS, reply_budget


def _request(default: int | None) -> SimpleNamespace:
    state = SimpleNamespace() if default is None else SimpleNamespace(max_tokens_default=default)
    return SimpleNamespace(app=SimpleNamespace(state=state))


def test_reply_budget() -> None:
    assert reply_budget(_request(None), None, 10, 100_000) == DEFAULT_MAX_TOKENS == 2048
    assert reply_budget(_request(64), None, 10, 256) == 64
    assert reply_budget(_request(64), None, 220, 256) == 36  # the context's remainder
    assert reply_budget(_request(64), 500, 10, 256) == 500  # asked: the route's check judges it
    assert reply_budget(_request(0), None, 10, 256) is None  # no bound
    assert reply_budget(_request(64), None, 256, 256) is None  # no room: the route names the error


@dataclass
class _Served:
    name: str
    engine: object = field(default_factory=lambda: SimpleNamespace(on_gpu=False))


def test_banner_lines() -> None:
    config = SimpleNamespace(host="127.0.0.1", port=8000, api_keys=("k",))
    gpu = _Served("b:latest", SimpleNamespace(on_gpu=True))
    lines = banner_lines(config, [_Served("a:latest"), gpu], 2048)
    assert lines[0] == f"{READY} on http://127.0.0.1:8000"
    assert "  web UI:      http://127.0.0.1:8000/ui/" in lines
    assert "  models:      a:latest (cpu), b:latest (cuda)" in lines
    assert "  API key:     required (Authorization: Bearer KEY)" in lines
    assert "none: a reply may fill the context" in banner_lines(config, [], 0)[-1]
    assert base_url("::1", 1) == "http://[::1]:1"


def test_template_origin() -> None:
    assert template_origin("{{ messages }}", "llama") == "model"
    assert template_origin(None, "gemma3") == "built-in"
    assert template_origin(None, "llama") == "none"


def test_a_closed_standard_output_does_not_stop_the_server() -> None:
    import io

    from mlxr.server.banner import print_banner

    out = io.StringIO()
    out.close()
    print_banner(SimpleNamespace(host="127.0.0.1", port=1, api_keys=()), [], 8, out)  # no ValueError
