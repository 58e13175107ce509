"""Images over HTTP with the official clients against a real `mlxr serve` of the tiny random
Gemma 3 vision model: Ollama `images` on /api/generate and /api/chat, OpenAI `image_url` data
URLs (remote URLs refused without --allow-remote-images), /api/show's `vision` capability, image
tokens counted in usage, the prefix cache sparing the tower on a re-sent image (the metric),
and a text-only model refusing images with a 400 that says so."""
from __future__ import annotations

import base64

import httpx
import ollama
import openai
import pytest

from image_fixtures import png, png_claiming, solid
from model_fixtures import FIXTURES, fixture_model
from server_harness import running_server, scrape

TOKENS_PER_IMAGE = 16


@pytest.fixture(scope="module")
def vlm_url(tmp_path_factory):
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-gemma3-vlm", FIXTURES)
    with running_server(tmp_path_factory.mktemp("vlm-home"), "--model", str(hf_dir)) as url:
        yield url


@pytest.fixture(scope="module")
def model(vlm_url):
    return httpx.get(vlm_url + "/api/tags").json()["models"][0]["name"]


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def encoder_calls(url: str) -> float:
    return sum(v for k, v in scrape(url).items() if k.startswith("mlxr:vision_encoder_calls_total"))


def test_show_says_vision(vlm_url, model):
    shown = ollama.Client(vlm_url).show(model)
    assert "vision" in shown.capabilities
    info = shown.modelinfo  # the tower's shape from the fixture's vision_config, as Ollama names it
    assert info["mlxr.vision.tokens_per_image"] == TOKENS_PER_IMAGE
    assert info["gemma3.vision.patch_size"] == 4 and info["gemma3.vision.image_size"] == 32


def test_the_model_list_says_it_takes_images(vlm_url, model):
    """Before and after it is loaded (the config's vision_config, then the loaded tower)."""
    card = httpx.get(vlm_url + f"/v1/models/{model}").json()
    assert card["capabilities"] == ["completion", "vision"]
    ollama.Client(vlm_url).generate(model=model, prompt="hi", options={"num_predict": 1})
    listed = [c for c in openai.OpenAI(base_url=vlm_url + "/v1", api_key="x").models.list().data if c.id == model]
    assert listed[0].model_extra["capabilities"] == ["completion", "vision"]


def test_ollama_generate_and_chat_take_base64_images(vlm_url, model):
    client = ollama.Client(vlm_url)
    reply = client.generate(model=model, prompt="What is this?", images=[png(40, 30, 1)],
                            options={"num_predict": 5, "temperature": 0})
    assert reply.done and reply.eval_count == 5
    assert reply.prompt_eval_count > TOKENS_PER_IMAGE
    chat = client.chat(model=model, messages=[{"role": "user", "content": "And this?", "images": [png(30, 40, 2)]}],
                       options={"num_predict": 5, "temperature": 0})
    assert chat.done and chat.prompt_eval_count > TOKENS_PER_IMAGE
    streamed = list(client.chat(model=model, stream=True, options={"num_predict": 4, "temperature": 0},
                                messages=[{"role": "user", "content": "Again", "images": [png(30, 40, 2)]}]))
    assert streamed[-1].done and streamed[-1].eval_count == 4


def test_openai_image_url_data_urls_and_the_cache(vlm_url, model):
    client = openai.OpenAI(base_url=vlm_url + "/v1", api_key="none")
    content = [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": data_url(solid(20, 20, (9, 99, 199)))}}]
    before = encoder_calls(vlm_url)
    first = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                           max_tokens=4, temperature=0)
    assert encoder_calls(vlm_url) == before + 1
    again = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                           max_tokens=4, temperature=0)
    assert encoder_calls(vlm_url) == before + 1  # the same image: its blocks came from the prefix cache
    assert again.choices[0].message.content == first.choices[0].message.content
    text_only = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe"}],
                                               max_tokens=1)
    assert first.usage.prompt_tokens >= text_only.usage.prompt_tokens + TOKENS_PER_IMAGE


def test_openai_remote_image_url_refused_without_the_flag(vlm_url, model):
    client = openai.OpenAI(base_url=vlm_url + "/v1", api_key="none")
    content = [{"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}]
    with pytest.raises(openai.BadRequestError, match="--allow-remote-images"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], max_tokens=2)


def test_bad_image_is_a_400_naming_it(vlm_url, model):
    client = ollama.Client(vlm_url)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=model, messages=[{"role": "user", "content": "x", "images": [png(), b"not an image"]}])
    assert e.value.status_code == 400 and "messages.0.images[1]" in str(e.value)


def test_text_only_model_refuses_images(tmp_path):
    gguf = str(fixture_model("tiny-llama").gguf_path)
    with running_server(tmp_path, "--model", gguf) as url:
        name = httpx.get(url + "/api/tags").json()["models"][0]["name"]
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(url).generate(model=name, prompt="x", images=[png()])
        assert e.value.status_code == 400 and "text only" in str(e.value)
        assert "vision" not in ollama.Client(url).show(name).capabilities
        assert "capabilities" not in httpx.get(url + f"/v1/models/{name}").json()
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        content = [{"type": "image_url", "image_url": {"url": data_url(png())}}]
        with pytest.raises(openai.BadRequestError, match="text only"):
            client.chat.completions.create(model=name, messages=[{"role": "user", "content": content}], max_tokens=2)


def test_responses_input_image(vlm_url, model):
    client = openai.OpenAI(base_url=vlm_url + "/v1", api_key="none")
    content = [{"type": "input_text", "text": "Describe"}, {"type": "input_image", "image_url": data_url(png(30, 30, 4))}]
    reply = client.responses.create(model=model, input=[{"role": "user", "content": content}], max_output_tokens=4,
                                    temperature=0)
    assert reply.status in ("completed", "incomplete") and reply.usage.input_tokens > TOKENS_PER_IMAGE


def test_anthropic_image_blocks(vlm_url, model):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=vlm_url, api_key="none")
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png(30, 30, 5)).decode()}
    content = [{"type": "image", "source": source}, {"type": "text", "text": "What is it?"}]
    reply = client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": content}])
    assert reply.usage.input_tokens > TOKENS_PER_IMAGE and reply.usage.output_tokens == 4
    counted = client.messages.count_tokens(model=model, messages=[{"role": "user", "content": content}])
    assert counted.input_tokens == reply.usage.input_tokens


def test_hostile_images_over_http_are_400s_naming_the_image(vlm_url, model):
    """A bomb's header and too many images: 400s in bounded time (tests/hostile has the rest)."""
    import time

    client = openai.OpenAI(base_url=vlm_url + "/v1", api_key="none")
    content = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": data_url(png_claiming(30000, 30000))}}]
    t0 = time.perf_counter()
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\].*MLXR_MAX_IMAGE_PIXELS"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], max_tokens=2)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(vlm_url).generate(model=model, prompt="x", images=[png()] * 9)
    assert e.value.status_code == 400 and "MLXR_MAX_IMAGES" in str(e.value)
