"""A GGUF model and llama.cpp's mmproj file created as one model over /api/create (both pushed as
blobs with the official `ollama` client, as `ollama create` sends a model with its projector):
/api/show says it takes images, and a greedy answer to an image prompt equals the one the same
server gives from the Hugging Face directory the files were converted from. A malformed
projector is a 400 that says what is wrong with it."""
from __future__ import annotations

import httpx
import ollama
import pytest
from image_fixtures import png
from mmproj_files import rewrite
from model_fixtures import FIXTURES
from server_harness import running_server

OPTIONS = {"num_predict": 12, "temperature": 0}


@pytest.fixture(scope="module")
def files():
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.mmproj_fixtures import llama_cpp_vlm

    try:
        return llama_cpp_vlm("tiny-gemma3-vlm-swa", FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def url(tmp_path_factory, files):
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    hf_dir = vlm_fixture_dir("tiny-gemma3-vlm-swa", FIXTURES)
    with running_server(tmp_path_factory.mktemp("mmproj-home"), "--model", str(hf_dir)) as url:
        yield url


def test_create_from_model_and_projector_blobs_takes_images(url, files):
    client = ollama.Client(url)
    model, mmproj = files
    blobs = {"model.gguf": client.create_blob(model), "mmproj.gguf": client.create_blob(mmproj)}
    assert client.create(model="vlm-gguf", files=blobs).status == "success"
    shown = client.show("vlm-gguf")
    assert "vision" in shown.capabilities and shown.modelinfo["mlxr.vision.tokens_per_image"] == 16
    hf_name = next(m.model for m in client.list().models if m.model != "vlm-gguf:latest")
    messages = [{"role": "user", "content": "What is this?", "images": [png(40, 30, 1)]}]
    from_gguf = client.chat(model="vlm-gguf", messages=messages, options=OPTIONS)
    from_hf = client.chat(model=hf_name, messages=messages, options=OPTIONS)
    assert from_gguf.prompt_eval_count == from_hf.prompt_eval_count > 16
    assert from_gguf.message.content == from_hf.message.content and from_gguf.eval_count == 12


def test_create_refuses_a_malformed_projector_with_the_reason(url, files, tmp_path):
    client = ollama.Client(url)
    model, mmproj = files
    bad = rewrite(mmproj, tmp_path / "mmproj.gguf", drop=("v.post_ln.weight",))
    blobs = {"model.gguf": client.create_blob(model), "mmproj.gguf": client.create_blob(bad)}
    reply = httpx.post(url + "/api/create", json={"model": "broken", "files": blobs, "stream": False}, timeout=60)
    assert reply.status_code == 400 and "lacks tensors: v.post_ln.weight" in reply.text
    both = {"a.gguf": blobs["mmproj.gguf"], "b.gguf": client.create_blob(mmproj)}
    reply = httpx.post(url + "/api/create", json={"model": "broken", "files": both, "stream": False}, timeout=60)
    assert reply.status_code == 400 and "both are an mmproj file" in reply.text
    assert "broken:latest" not in [m.model for m in client.list().models]


def test_serve_takes_a_gguf_with_its_mmproj(tmp_path, files):
    model, mmproj = files
    with running_server(tmp_path / "home", "--model", str(model), "--mmproj", str(mmproj)) as served:
        client = ollama.Client(served)
        (name,) = [m.model for m in client.list().models]
        assert "vision" in client.show(name).capabilities
        reply = client.generate(model=name, prompt="What is this?", images=[png(40, 30, 1)], options=OPTIONS)
        assert reply.done and reply.prompt_eval_count > 16 and reply.eval_count == 12


def test_serve_refuses_an_mmproj_without_one_model_file(tmp_path, files):
    import subprocess

    from server_harness import server_command

    _, mmproj = files
    cmd = server_command(tmp_path / "home", 1, "--mmproj", str(mmproj))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "--mmproj goes with exactly one --model" in res.stderr
