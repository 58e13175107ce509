"""The web UI's first-minutes states in Debian's chromium (Playwright) against a real `mlxr serve`:
a model loading, a 375 px wide screen, idle metrics, model details and a base model.

The server has one model slot (--max-loaded-models 1): while alpha streams a long reply, a chat
with beta waits for the slot and then loads, which the UI must show instead of a bare cursor.
Screenshots go to a temporary folder (printed with -s); MLXR_UPDATE_SCREENSHOTS=1 also copies
three of them to docs/screenshots/."""
from __future__ import annotations

import json
import os
import shutil
import threading

import httpx
import pytest
from model_fixtures import ROOT, fixture_model
from playwright.sync_api import expect, sync_playwright
from server_harness import running_server
from webui_browser import ConsoleErrors, launch

SHORT = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "num_predict": 8, "seed": "7"}
BETA_PARAMETERS = {"temperature": 0.6, "top_k": 30, "repeat_penalty": 1.1}  # its Modelfile's sampling defaults
PAGES = ["chat", "models", "metrics", "logs", "playground", "settings"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("ux-models")
    alpha, beta = d / "alpha.gguf", d / "beta.gguf"
    shutil.copyfile(fixture_model("tiny-llama-long").gguf_path, alpha)  # a long context: a long stream
    shutil.copyfile(fixture_model("tiny-llama-tied").gguf_path, beta)
    base = d / "base-gemma"  # the tiny Gemma 3 files without a chat template: a base model
    shutil.copytree(fixture_model("tiny-gemma3").hf_dir, base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    with running_server(d / "home", "--model", str(alpha), "--max-loaded-models", "1") as url:
        for name, path, params in (("beta", beta, BETA_PARAMETERS), ("basegemma", base, None)):
            r = httpx.post(url + "/api/create", json={"model": name, "from": str(path), "parameters": params}, timeout=60)
            assert r.status_code == 200, r.text
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


# The few of them that docs/webui.md shows: MLXR_UPDATE_SCREENSHOTS=1 copies them there.
DOC_SHOTS = {"loading-first.png": "loading.png", "narrow-nav-open.png": "narrow.png", "metrics-idle.png": "metrics-idle.png"}


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = tmp_path_factory.mktemp("ux-screenshots")
    print(f"\nscreenshots in {out}")
    yield out
    if os.environ.get("MLXR_UPDATE_SCREENSHOTS") == "1":
        for name, doc_name in DOC_SHOTS.items():
            if (out / name).exists():
                shutil.copyfile(out / name, ROOT / "docs" / "screenshots" / doc_name)


@pytest.fixture
def open_ui(browser, server):
    opened = []

    def go(page: str, model: str = "alpha:latest", width: int = 1280, height: int = 760, storage: dict | None = None):
        context = browser.new_context(viewport={"width": width, "height": height})
        context.add_init_script(f"""
            if (!sessionStorage.getItem('seeded')) {{
              localStorage.setItem('mlxr.model', {json.dumps(model)});
              localStorage.setItem('mlxr.sampling', {json.dumps(json.dumps(SHORT))});
              for (const [k, v] of Object.entries({json.dumps(storage or {})})) localStorage.setItem(k, v);
              sessionStorage.setItem('seeded', '1');
            }}""")
        ui = context.new_page()
        errors = ConsoleErrors(ui)
        ui.goto(f"{server}/ui/#/{page}")
        opened.append((context, errors))
        return ui

    yield go
    for context, errors in opened:
        context.close()
        assert errors.unexpected() == []


class BusyAlpha:
    """alpha streaming a long reply in a thread, holding the one model slot until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.stop, self.started = url, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        ctx = httpx.post(self.url + "/api/show", json={"model": "alpha"}, timeout=60).json()["model_info"]["llama.context_length"]
        body = {"model": "alpha", "prompt": "go on", "max_tokens": ctx - 16, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                self.started.set()
                if self.stop.is_set():
                    return

    def __enter__(self):
        self.thread.start()
        assert self.started.wait(60), "alpha's stream did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)


def send(ui, text: str) -> None:
    ui.get_by_test_id("chat-input").fill(text)
    ui.get_by_test_id("chat-input").press("Enter")


def test_a_chat_with_a_model_that_is_not_loaded_shows_it_loading(open_ui, server, shots):
    ui = open_ui("chat", model="beta:latest")
    with BusyAlpha(server):
        send(ui, "Hello beta")
        loading = ui.get_by_test_id("model-loading")
        expect(loading).to_be_visible(timeout=15_000)
        expect(loading).to_contain_text("beta:latest")
        expect(loading).to_have_attribute("data-stage", "waiting for a slot")
        ui.wait_for_timeout(1200)  # the seconds count up
        ui.screenshot(path=shots / "loading-first.png")
        assert float(loading.get_by_test_id("loading-time").inner_text().split(" s")[0]) >= 1.0
    expect(ui.get_by_test_id("msg-assistant").last.get_by_test_id("reply-stats")).to_contain_text("tok/s", timeout=60_000)
    expect(loading).to_have_count(0)
    # Loaded once, the next load of beta is measured against that one: a bar with an estimate.
    httpx.post(server + "/api/generate", json={"model": "beta", "keep_alive": 0}, timeout=60)
    with BusyAlpha(server):
        send(ui, "Hello again")
        expect(loading).to_contain_text("loading then takes about", timeout=15_000)
        ui.screenshot(path=shots / "loading-estimate.png")
    expect(ui.get_by_test_id("msg-assistant")).to_have_count(2, timeout=60_000)


def test_every_page_fits_a_375_px_screen_and_the_nav_collapses(open_ui, shots):
    ui = open_ui("chat", width=375, height=740)
    toggle = ui.get_by_test_id("nav-toggle")
    expect(toggle).to_be_visible()
    expect(ui.get_by_test_id("nav-models")).to_be_hidden()
    for page in PAGES:
        toggle.click()
        ui.get_by_test_id(f"nav-{page}").click()
        expect(ui.get_by_test_id(f"nav-{page}")).to_be_hidden()  # the menu closes on the way
        expect(ui.locator(f"main.page-{page}")).to_be_visible()
        ui.wait_for_timeout(500)
        overflow = ui.evaluate("[document.documentElement.scrollWidth, document.body.scrollWidth]")
        assert max(overflow) <= 375, f"{page} is {overflow} px wide at 375 px"
        ui.screenshot(path=shots / f"narrow-{page}.png")
    ui.goto(ui.url.split("#")[0] + "#/chat")
    expect(ui.get_by_test_id("new-chat")).to_be_hidden()  # the chat list is a panel on demand
    ui.get_by_test_id("toggle-chats").click()
    expect(ui.get_by_test_id("new-chat")).to_be_visible()
    toggle.click()
    ui.screenshot(path=shots / "narrow-nav-open.png")


def test_idle_metrics_say_idle_and_activity_shows_up(open_ui, server, shots):
    ui = open_ui("metrics")
    expect(ui.get_by_test_id("metrics-status")).to_have_text("idle", timeout=15_000)
    expect(ui.get_by_test_id("metrics-idle")).to_contain_text("Idle")
    expect(ui.get_by_test_id("chart-idle").first).to_contain_text("idle")
    ui.wait_for_timeout(2500)
    ui.screenshot(path=shots / "metrics-idle.png")
    r = httpx.post(server + "/api/generate", timeout=60,
                   json={"model": "alpha", "prompt": "count", "stream": False, "options": {"num_predict": 16}})
    assert r.status_code == 200
    # The tokens of that request show in the last minutes' charts; the page is idle again after.
    expect(ui.get_by_test_id("chart-idle").filter(has_text="no tokens")).to_have_count(0, timeout=10_000)
    expect(ui.get_by_test_id("metrics-idle")).to_contain_text("since", timeout=10_000)
    ui.screenshot(path=shots / "metrics-after.png")


def test_model_details_are_tables_with_the_sampling_defaults_and_a_base_model_is_marked(open_ui, server, shots):
    ui = open_ui("models")
    for name, kind in (("beta:latest", "chat model"), ("basegemma:latest", "base model")):
        ui.locator(f"tr[data-model='{name}']").get_by_role("button", name=name).click()
        drawer = ui.get_by_test_id("details-drawer")
        expect(drawer.get_by_test_id("model-summary")).to_contain_text(kind)
        expect(drawer.locator("pre:visible")).to_have_count(0)  # no raw JSON on view
        shown = httpx.post(server + "/api/show", json={"model": name}, timeout=30).json()
        sampling = shown["model_info"]["mlxr.sampling_defaults"]
        table = drawer.get_by_test_id("sampling-defaults")
        if name == "beta:latest":
            assert {k: sampling[k] for k in BETA_PARAMETERS} == BETA_PARAMETERS
            expect(table.locator("tbody tr")).to_have_count(len(sampling))
            expect(table.locator("tr").filter(has_text="temperature")).to_contain_text("Modelfile")
        for key, value in sampling.items():
            shown_value = str(int(value)) if float(value).is_integer() else str(value)
            expect(table.locator("tr").filter(has_text=key).first).to_contain_text(shown_value)
        arch = drawer.get_by_test_id("model-info")
        ctx_key = next(k for k in shown["model_info"] if k.endswith(".context_length"))
        expect(arch.locator("tr").filter(has_text=ctx_key)).to_contain_text(f"{shown['model_info'][ctx_key]:,}")
        ui.screenshot(path=shots / f"details-{name.split(':')[0]}.png")
        drawer.get_by_role("button", name="×").click()
    # The chat page steers the base model to completion mode, and leaves the chat model alone.
    ui.goto(ui.url.split("#")[0] + "#/chat")
    ui.get_by_test_id("model-picker").select_option("basegemma:latest")
    note = ui.get_by_test_id("base-model-note")
    expect(note).to_contain_text("base model")
    ui.screenshot(path=shots / "chat-base-model.png")
    ui.get_by_test_id("use-completion").click()
    expect(ui.get_by_test_id("completion-prompt")).to_be_visible()
    expect(ui.get_by_test_id("model-picker")).to_have_value("basegemma:latest")
    ui.goto(ui.url.split("#")[0] + "#/chat")
    ui.get_by_test_id("model-picker").select_option("beta:latest")
    ui.wait_for_timeout(1000)
    expect(note).to_have_count(0)


def test_a_reopened_chat_opens_at_its_newest_message(open_ui):
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}\n" + "line\n" * 4}
                for i in range(60)]
    conversation = {"id": "long", "title": "A long chat", "model": "alpha:latest", "system": "",
                    "messages": messages, "updated": 1}
    ui = open_ui("chat", storage={"mlxr.conversations": json.dumps([conversation])})
    box = ui.get_by_test_id("messages")
    expect(box).to_contain_text("message 59")
    gap = box.evaluate("el => el.scrollHeight - el.scrollTop - el.clientHeight")
    assert box.evaluate("el => el.scrollHeight > 2 * el.clientHeight")  # a chat longer than the screen
    assert gap < 5, f"opened {gap} px above the newest message"
    expect(ui.get_by_test_id("msg-assistant").last).to_be_in_viewport()


def test_the_similarity_matrix_has_a_colour_scale_and_a_legend(open_ui, shots):
    ui = open_ui("playground")
    ui.get_by_test_id("embed-run").click()
    matrix = ui.get_by_test_id("cosine-matrix")
    expect(matrix.locator("tbody td")).to_have_count(9, timeout=30_000)
    cells = [(float(c.inner_text()), c.evaluate("el => getComputedStyle(el).backgroundColor"))
             for c in matrix.locator("tbody td").all()]
    off = [(v, colour) for i, (v, colour) in enumerate(cells) if i % 4]  # off the diagonal
    lowest, highest = min(off)[1], max(off)[1]
    assert lowest != highest, "the lowest and highest pair have one colour"
    legend = ui.get_by_test_id("similarity-legend")
    expect(legend).to_contain_text(f"{min(off)[0]:.3f}")
    expect(legend).to_contain_text(f"{max(off)[0]:.3f}")
    matrix.scroll_into_view_if_needed()
    ui.screenshot(path=shots / "similarity.png")


def test_load_on_the_models_page_shows_the_loading_state_in_the_row(open_ui, server):
    httpx.post(server + "/api/generate", json={"model": "beta", "keep_alive": 0}, timeout=60)
    ui = open_ui("models")
    row = ui.locator("tr[data-model='beta:latest']")
    expect(row).to_contain_text("on disk")
    with BusyAlpha(server):
        row.get_by_role("button", name="Load").click()
        expect(row.get_by_test_id("model-loading")).to_contain_text("free model slot", timeout=15_000)
    expect(row).to_contain_text("loaded", timeout=60_000)
    expect(row.get_by_test_id("model-loading")).to_have_count(0)


def test_a_chat_leaves_unset_sampling_fields_to_the_model(open_ui):
    # Empty fields are not sent, so the model's own defaults (its preset, files or Modelfile)
    # apply; the UI once sent Ollama's 0.8 / 0.9 / 40 with every message.
    unset = {"temperature": None, "top_p": None, "top_k": None, "num_predict": 4, "seed": ""}
    ui = open_ui("chat", model="beta:latest", storage={"mlxr.sampling": json.dumps(unset)})
    with ui.expect_request(lambda r: r.url.endswith("/api/chat") and r.method == "POST") as sent:
        send(ui, "hello")
    options = json.loads(sent.value.post_data)["options"]
    assert options == {"num_predict": 4}
    expect(ui.get_by_label("temperature")).to_have_attribute("placeholder", "model's default")
