"""Images and reranking in the web UI, in Debian's chromium against a real `mlxr serve` of the
tiny random Gemma 3 vision model, a tiny random XLM-R cross-encoder and a text-only Llama:
images attached to a chat (button, drop, paste) go out as Ollama `images` and come back as a
streamed reply with thumbnails; a text-only model says so; the vision playground streams an
answer with the image token count; the rerank playground's table holds sentence-transformers'
CrossEncoder scores. MLXR_UPDATE_SCREENSHOTS=1 writes the screenshots to docs/screenshots/."""
from __future__ import annotations

import base64
import json
import os

import httpx
import ollama
import pytest
from encoder_fixtures import encoder_dir
from image_fixtures import encoded
from model_fixtures import FIXTURES, ROOT, fixture_model
from playwright.sync_api import expect, sync_playwright
from server_harness import running_server
from webui_browser import ConsoleErrors, launch

TOKENS_PER_IMAGE = 16  # the fixture's mm_tokens_per_image
SHORT = {"temperature": 0.0, "num_predict": 24, "top_p": None, "top_k": None, "seed": ""}
PICTURE = encoded(320, 240, "RGB", "PNG", seed=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from mlxr.testing.vlm_fixtures import vlm_fixture_dir

    vlm = vlm_fixture_dir("tiny-gemma3-vlm", FIXTURES)
    args = ["--model", str(vlm), "--model", str(encoder_dir("xlmr-rerank")),
            "--model", str(fixture_model("tiny-llama").gguf_path)]
    with running_server(tmp_path_factory.mktemp("webui-vision"), *args) as url:
        yield url


@pytest.fixture(scope="module")
def names(server) -> dict[str, str]:
    """Each model's registry name, told apart by what /api/show says it does."""
    found = {}
    for m in httpx.get(server + "/api/tags").json()["models"]:
        caps = httpx.post(server + "/api/show", json={"model": m["name"]}).json()["capabilities"]
        found["vlm" if "vision" in caps else "rerank" if "rerank" in caps else "text"] = m["name"]
    assert len(found) == 3, found
    return found


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    if os.environ.get("MLXR_UPDATE_SCREENSHOTS") == "1":
        return ROOT / "docs" / "screenshots"
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture
def page_at(browser, server, names):
    """Opens a fresh profile at a page, with the vision model chosen and short greedy replies."""
    opened = []

    def open_(hash_: str, model: str = "vlm"):
        context = browser.new_context(viewport={"width": 1280, "height": 760})
        seed = {"mlxr.model": names[model], "mlxr.sampling": json.dumps(SHORT)}
        context.add_init_script(f"""
            if (!sessionStorage.getItem('seeded')) {{
              for (const [k, v] of Object.entries({json.dumps(seed)})) localStorage.setItem(k, v);
              sessionStorage.setItem('seeded', '1');
            }}""")
        page = context.new_page()
        errors = ConsoleErrors(page)
        opened.append((context, errors))
        page.goto(f"{server}/ui/#/{hash_}")
        return page

    yield open_
    for context, errors in opened:
        context.close()
        assert errors.unexpected() == []


def as_file(name: str = "picture.png", data: bytes = PICTURE) -> dict:
    return {"name": name, "mimeType": "image/png", "buffer": data}


def streamed_chunks(response) -> list[dict]:
    return [json.loads(line) for line in response.body().decode().splitlines() if line.strip()]


def test_chat_sends_an_attached_image_and_streams_the_reply(page_at, shots):
    page = page_at("chat")
    expect(page.get_by_test_id("model-takes-images")).to_be_visible(timeout=15_000)
    page.locator("input[type=file]").set_input_files(as_file())
    expect(page.get_by_test_id("composer-images").locator("img")).to_have_count(1)
    page.get_by_test_id("chat-input").fill("What is in this picture?")
    with page.expect_response("**/api/chat", timeout=60_000) as answered:
        page.get_by_test_id("send").click()
    sent = answered.value.request.post_data_json["messages"]
    assert sent == [{"role": "user", "content": "What is in this picture?", "images": [base64.b64encode(PICTURE).decode()]}]
    chunks = streamed_chunks(answered.value)
    assert sum(1 for c in chunks if c.get("message", {}).get("content")) >= 2  # a stream, not one answer
    assert chunks[-1]["done"] and chunks[-1]["prompt_eval_count"] > TOKENS_PER_IMAGE
    reply = page.get_by_test_id("msg-assistant").last
    stats = reply.get_by_test_id("reply-stats")
    expect(stats).to_contain_text("tok/s", timeout=30_000)
    expect(stats).to_contain_text(f"prompt {chunks[-1]['prompt_eval_count']} tokens")
    assert reply.locator(".markdown").inner_text().strip() == "".join(c["message"]["content"] for c in chunks).strip()
    thumb = page.get_by_test_id("msg-user").get_by_test_id("msg-images").locator("img")
    expect(thumb).to_have_count(1)
    assert page.evaluate("(img) => img.naturalWidth", thumb.element_handle()) == 320  # the image itself, decoded
    expect(page.get_by_test_id("composer-images")).to_have_count(0)
    page.screenshot(path=shots / "chat-image.png")
    page.reload()  # the image stays with the conversation
    expect(page.get_by_test_id("msg-user").get_by_test_id("msg-images").locator("img")).to_have_count(1)


def _drop(page, target: str, name: str, data: bytes) -> None:
    page.evaluate("""([sel, name, bytes]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(bytes)], name, { type: "image/png" }));
        document.querySelector(sel).dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
    }""", [target, name, list(data)])


def _paste(page, target: str, name: str, data: bytes) -> None:
    page.evaluate("""([sel, name, bytes]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(bytes)], name, { type: "image/png" }));
        document.querySelector(sel).dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
    }""", [target, name, list(data)])


def test_drop_and_paste_attach_images_sent_in_order(page_at):
    page = page_at("chat")
    first, second = encoded(64, 48, "RGB", "PNG", seed=4), encoded(48, 64, "RGB", "PNG", seed=5)
    _drop(page, "[data-testid=composer]", "dropped.png", first)
    expect(page.get_by_test_id("composer-images").locator("img")).to_have_count(1)
    _paste(page, "[data-testid=chat-input]", "pasted.png", second)
    expect(page.get_by_test_id("composer-images").locator("img")).to_have_count(2)
    page.get_by_title("Remove dropped.png").click()
    expect(page.get_by_test_id("composer-images").locator("img")).to_have_count(1)
    _drop(page, "[data-testid=composer]", "dropped.png", first)
    with page.expect_request("**/api/chat") as req:
        page.get_by_test_id("chat-input").fill("Two pictures")
        page.get_by_test_id("chat-input").press("Enter")
    images = req.value.post_data_json["messages"][0]["images"]
    assert images == [base64.b64encode(second).decode(), base64.b64encode(first).decode()]
    expect(page.get_by_test_id("msg-assistant").last.get_by_test_id("reply-stats")).to_contain_text("tok/s", timeout=60_000)


def test_a_text_only_model_says_so_and_sends_no_image(page_at, names):
    page = page_at("chat", model="text")
    expect(page.get_by_test_id("model-text-only")).to_contain_text(f"{names['text']} takes text only", timeout=15_000)
    page.locator("input[type=file]").set_input_files(as_file())
    expect(page.get_by_test_id("text-only-note")).to_contain_text("takes text only")
    expect(page.get_by_test_id("send")).to_be_disabled()
    page.get_by_test_id("chat-input").press("Enter")
    page.wait_for_timeout(300)
    expect(page.get_by_test_id("msg-user")).to_have_count(0)
    page.get_by_test_id("model-picker").select_option(names["vlm"])
    expect(page.get_by_test_id("text-only-note")).to_have_count(0)
    expect(page.get_by_test_id("send")).to_be_enabled()


def test_vision_playground_streams_an_answer_with_the_image_token_count(page_at, server, names, shots):
    page = page_at("playground", model="text")
    panel = page.get_by_test_id("vision-panel")
    expect(panel.get_by_test_id("vision-text-only")).to_contain_text("takes text only", timeout=15_000)
    page.get_by_test_id("model-picker").select_option(names["vlm"])
    expect(panel.get_by_test_id("vision-image-tokens")).to_have_text(f"{TOKENS_PER_IMAGE} image tokens per image")
    panel.get_by_test_id("vision-file").set_input_files(as_file())
    expect(panel.get_by_test_id("vision-thumbnail").locator("img")).to_have_count(1)
    panel.get_by_test_id("vision-prompt").fill("Describe this image.")
    with page.expect_response("**/api/chat", timeout=60_000) as answered:
        panel.get_by_test_id("vision-run").click()
    chunks = streamed_chunks(answered.value)
    expect(panel.get_by_test_id("vision-stats")).to_contain_text(f"prompt {chunks[-1]['prompt_eval_count']} tokens",
                                                                  timeout=30_000)
    # The same request through the official client: the same prompt count and greedy answer.
    reference = ollama.Client(server).chat(model=names["vlm"], options={"num_predict": 64, "temperature": 0},
                                           messages=[{"role": "user", "content": "Describe this image.", "images": [PICTURE]}])
    assert chunks[-1]["prompt_eval_count"] == reference.prompt_eval_count
    assert panel.get_by_test_id("vision-answer").inner_text().strip() == reference.message.content.strip()
    panel.screenshot(path=shots / "playground-vision.png")


def test_rerank_playground_shows_cross_encoder_scores_best_first(page_at, names, shots):
    from sentence_transformers import CrossEncoder

    page = page_at("playground", model="rerank")
    query, docs = "where is the cat", ["the cat sat on the mat", "stock prices fell", "a dog in the park", "cats and mats"]
    page.get_by_test_id("rerank-query").fill(query)
    page.get_by_test_id("rerank-documents").fill("\n".join(docs))
    page.get_by_test_id("rerank-run").click()
    rows = page.get_by_test_id("rerank-table").locator("tbody tr")
    expect(rows).to_have_count(len(docs), timeout=30_000)
    shown = [[c.inner_text() for c in rows.nth(i).locator("td").all()] for i in range(len(docs))]
    reference = CrossEncoder(str(encoder_dir("xlmr-rerank")), device="cpu").predict([(query, d) for d in docs])
    order = sorted(range(len(docs)), key=lambda i: -reference[i])
    assert [int(r[2]) for r in shown] == order and [r[1] for r in shown] == [docs[i] for i in order]
    assert max(abs(float(r[3]) - float(reference[int(r[2])])) for r in shown) <= 1e-4
    page.get_by_test_id("rerank-table").scroll_into_view_if_needed()
    page.screenshot(path=shots / "playground-rerank.png")
