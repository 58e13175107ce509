"""Anthropic `thinking` on a model whose template thinks (the generation prompt opens `<think>`,
`enable_thinking=false` closes it empty): a random-weight model's reply is all reasoning, so
it comes back as a thinking block, streamed as thinking_delta; thinking disabled gives text."""
from __future__ import annotations

import json
import shutil

import anthropic
import httpx
import pytest
from model_fixtures import fixture_model
from server_harness import running_server

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "hi"}]
THINK = {"type": "enabled", "budget_tokens": 8}  # under max_tokens, as Anthropic requires
GREEDY = {"extra_body": {"temperature": 0.0}, "max_tokens": 12}  # the client has no temperature argument


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("thinker") / "model"
    shutil.copytree(fixture_model("tiny-llama3").hf_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": THINKING_TEMPLATE}))
    with running_server(tmp_path_factory.mktemp("home"), "--model", str(model_dir)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


def blocks(message) -> list[tuple[str, str]]:
    return [(b.type, b.thinking if b.type == "thinking" else b.text) for b in message.content]


def raw_text(base_url: str, model: str, thinking: bool, max_tokens: int = 12) -> str:
    """What the model writes on the same rendered prompt, through /v1/completions."""
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + (
        "<think>\n" if thinking else "<think>\n\n</think>\n\n")
    body = {"model": model, "prompt": prompt, "temperature": 0.0, "max_tokens": max_tokens}
    return httpx.post(base_url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]


def test_thinking_comes_as_a_thinking_block_within_its_budget_streamed_or_not(client, model, base_url):
    r = client.messages.create(model=model, messages=ASK, thinking=THINK, **GREEDY)
    assert r.content[0].type == "thinking"
    # The budget's 8 tokens of reasoning, closed; the reply goes on after it within max_tokens.
    assert r.content[0].thinking == raw_text(base_url, model, thinking=True, max_tokens=8).split("</think>")[0]
    assert 8 < r.usage.output_tokens <= 12
    with client.messages.stream(model=model, messages=ASK, thinking=THINK, **GREEDY) as s:
        deltas = [e.delta.thinking for e in s if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]
        final = s.get_final_message()
    assert "".join(deltas) == r.content[0].thinking and blocks(final) == blocks(r)
    assert final.usage.output_tokens == r.usage.output_tokens


def test_thinking_disabled_gives_text_alone(client, model, base_url):
    r = client.messages.create(model=model, messages=ASK, thinking={"type": "disabled"}, **GREEDY)
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == raw_text(base_url, model, thinking=False)


def test_thinking_blocks_in_history_are_accepted(client, model):
    history = [*ASK, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                       {"type": "redacted_thinking", "data": "opaque"},
                                                       {"type": "text", "text": "hello"}]},
               {"role": "user", "content": "again"}]
    r = client.messages.create(model=model, messages=history, thinking=THINK, **GREEDY)
    assert r.stop_reason in ("end_turn", "max_tokens") and r.usage.output_tokens <= 12


def test_budget_must_be_under_max_tokens(client, model):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=model, messages=ASK, thinking=THINK, max_tokens=8)
    assert "thinking.budget_tokens" in e.value.body["error"]["message"]


def test_adaptive_thinking_leaves_the_template_thinking(client, model, base_url):
    r = client.messages.create(model=model, messages=ASK, thinking={"type": "adaptive", "display": "summarized"},
                               **GREEDY)
    assert r.content[0].type == "thinking"  # no budget: the reasoning as long as the model goes on
    assert r.content[0].thinking == raw_text(base_url, model, thinking=True).split("</think>")[0]
