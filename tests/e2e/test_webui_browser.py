"""The web UI in Debian's chromium (Playwright) against a real `mlxr serve` with tiny models.

Screenshots are taken of every page; MLXR_UPDATE_SCREENSHOTS=1 writes them to docs/screenshots/
(the committed ones), otherwise to a temporary folder."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from model_fixtures import ROOT, fixture_model
from playwright.sync_api import Page, expect, sync_playwright
from server_harness import running_server
from webui_browser import ConsoleErrors, launch

KEY = "browser-test-key"
SHORT_REPLY = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "num_predict": 24, "seed": "7"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Two models to switch between and one to pull, as separate GGUF files."""
    d = tmp_path_factory.mktemp("webui-models")
    out = {}
    for name, fixture in (("alpha", "tiny-llama"), ("beta", "tiny-llama-tied"), ("pullme", "tiny-llama3")):
        out[name] = d / f"{name}.gguf"
        shutil.copyfile(fixture_model(fixture).gguf_path, out[name])
    return out


@pytest.fixture(scope="module")
def bench_profile(tmp_path_factory, files):
    """`mlxr bench --profile --json`, started at once and read by the metrics test."""
    d = tmp_path_factory.mktemp("webui-bench")
    out = d / "profile.json"
    cmd = [sys.executable, "-m", "mlxr.cli", "bench", "--model", str(files["alpha"]), "--profile",
           "--json", str(out), "--prompt-len", "8", "--gen-len", "4"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "MLXR_HOME": str(d)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait() -> Path:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
        return out

    yield wait
    if proc.poll() is None:
        proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory, files, bench_profile) -> str:
    home = tmp_path_factory.mktemp("webui-home")
    with running_server(home, "--model", str(files["alpha"]), "--model", str(files["beta"])) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    if os.environ.get("MLXR_UPDATE_SCREENSHOTS") == "1":
        out = ROOT / "docs" / "screenshots"
        out.mkdir(parents=True, exist_ok=True)
        return out
    return tmp_path_factory.mktemp("screenshots")


def open_page(browser, url: str, storage: dict[str, object] | None = None):
    """A fresh profile whose every request to another origin fails and counts as an error:
    the UI and /docs must work offline."""
    context = browser.new_context(viewport={"width": 1280, "height": 760})
    origin = "/".join(url.split("/")[:3])
    offsite: list[str] = []

    def block(route) -> None:
        offsite.append(f"request to another origin: {route.request.url}")
        route.abort()

    context.route(lambda u: not u.startswith(origin) and not u.startswith(("data:", "blob:")), block)
    if storage:
        items = {k: v if isinstance(v, str) else json.dumps(v) for k, v in storage.items()}
        context.add_init_script(f"""
            if (!sessionStorage.getItem('seeded')) {{
              for (const [k, v] of Object.entries({json.dumps(items)})) localStorage.setItem(k, v);
              sessionStorage.setItem('seeded', '1');
            }}""")
    page = context.new_page()
    errors = ConsoleErrors(page)
    errors.errors = offsite  # the same list: console errors and blocked requests together
    page.goto(url)
    return context, page, errors


@pytest.fixture
def ui(browser, server):
    """A fresh browser profile on the chat page, seeded with short replies from alpha."""
    context, page, errors = open_page(browser, server + "/ui/#/chat",
                                      {"mlxr.model": "alpha:latest", "mlxr.sampling": SHORT_REPLY})
    yield page
    context.close()
    assert errors.unexpected() == []


def test_docs_and_redoc_render_offline(browser, server):
    context, page, errors = open_page(browser, server + "/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("MLXR", timeout=15_000)
    expect(page.locator(".opblock-summary-path").filter(has_text="/api/chat").first).to_be_visible()
    page.goto(server + "/redoc")
    expect(page.locator("h1").first).to_contain_text("MLXR", timeout=15_000)
    context.close()
    assert errors.unexpected() == []


def send(page: Page, text: str) -> None:
    page.get_by_test_id("chat-input").fill(text)
    page.get_by_test_id("chat-input").press("Enter")


def wait_for(predicate, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_chat_streams_a_reply_with_ttft_and_tokens_per_second(ui, shots):
    send(ui, "Hello, who are you?")
    reply = ui.get_by_test_id("msg-assistant").last
    expect(reply).to_be_visible(timeout=30_000)
    expect(reply.get_by_test_id("reply-stats")).to_contain_text("tok/s")
    expect(reply.get_by_test_id("reply-stats")).to_contain_text("TTFT")
    assert len(reply.locator(".markdown").inner_text().strip()) > 0
    expect(ui.get_by_test_id("conversation-list").locator("li")).to_have_count(1)
    with ui.expect_request("**/api/chat") as regenerated:
        ui.get_by_test_id("regenerate").click()
    assert [m["role"] for m in regenerated.value.post_data_json["messages"]] == ["user"]
    expect(reply.get_by_test_id("reply-stats")).to_contain_text("tok/s", timeout=30_000)
    expect(ui.get_by_test_id("msg-assistant")).to_have_count(1)
    ui.get_by_test_id("msg-user").get_by_role("button", name="edit").click()
    ui.get_by_test_id("msg-user").locator("textarea").fill("Hello again, who are you?")
    with ui.expect_request("**/api/chat") as edited:
        ui.get_by_role("button", name="Save & send").click()
    assert edited.value.post_data_json["messages"] == [{"role": "user", "content": "Hello again, who are you?"}]
    expect(ui.get_by_test_id("msg-assistant").last.get_by_test_id("reply-stats")).to_contain_text("tok/s", timeout=30_000)
    expect(ui.get_by_test_id("msg-assistant")).to_have_count(1)
    ui.get_by_test_id("system-prompt").fill("You are terse.")
    ui.screenshot(path=shots / "chat.png")
    # The conversation survives a reload: it lives in localStorage.
    ui.reload()
    expect(ui.get_by_test_id("msg-user")).to_contain_text("Hello again, who are you?")


@pytest.mark.slow  # a 600 B/s link: ~30 s: the default suite keeps under 15 minutes
def test_stop_ends_a_stream_that_is_still_arriving(browser, server):
    long_reply = {**SHORT_REPLY, "num_predict": 200, "temperature": 0.0}
    context, page, errors = open_page(browser, server + "/ui/#/chat",
                                      {"mlxr.model": "alpha:latest", "mlxr.sampling": long_reply})
    # A slow link keeps the reply arriving for many seconds, so the test sees it mid-stream.
    cdp = context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions",
             {"offline": False, "latency": 0, "downloadThroughput": 600, "uploadThroughput": -1})
    send(page, "Tell me a long story")
    streaming = page.get_by_test_id("msg-streaming")
    text = streaming.locator(".markdown")  # the reply only, not the "waiting for the first token" line
    first = wait_for(lambda: text.count() and text.inner_text().strip(), 30, "streamed text")
    wait_for(lambda: len(text.inner_text().strip()) > len(first) + 5, 30, "more streamed text")
    page.get_by_test_id("stop").click()
    expect(page.get_by_test_id("send")).to_be_visible()
    expect(streaming).to_have_count(0)
    stats = page.get_by_test_id("msg-assistant").last.get_by_test_id("reply-stats")
    expect(stats).to_contain_text("stopped")
    kept = page.get_by_test_id("msg-assistant").last.inner_text()
    page.wait_for_timeout(1500)
    assert page.get_by_test_id("msg-assistant").last.inner_text() == kept
    context.close()
    assert errors.unexpected() == []


def test_switching_models_sends_the_next_message_to_the_new_model(ui, server):
    picker = ui.get_by_test_id("model-picker")
    expect(picker.locator("option")).to_have_count(2)
    picker.select_option("beta:latest")
    send(ui, "Hi beta")
    expect(ui.get_by_test_id("msg-assistant").last.get_by_test_id("reply-stats")).to_contain_text("tok/s", timeout=30_000)
    running = [m["name"] for m in httpx.get(server + "/api/ps").json()["models"]]
    assert "beta:latest" in running
    expect(picker.locator("option[value='beta:latest']")).to_contain_text("loaded")


def test_pull_a_local_file_with_progress_load_unload_copy_and_delete_it(ui, files, shots):
    ui.goto(ui.url.split("#")[0] + "#/models")
    ui.get_by_test_id("pull-source").fill(str(files["pullme"]))
    ui.get_by_test_id("pull-submit").click()
    progress = ui.get_by_test_id("pull-progress")
    expect(progress).to_contain_text("success", timeout=30_000)
    assert int(progress.get_attribute("data-steps")) >= 3  # manifest, import progress, success
    row = ui.locator("tr[data-model='pullme:latest']")
    expect(row).to_be_visible()
    row.get_by_role("button", name="pullme:latest").click()
    expect(ui.get_by_test_id("details-drawer")).to_contain_text("llama")
    ui.screenshot(path=shots / "models-details.png")
    ui.get_by_test_id("details-drawer").get_by_role("button", name="×").click()
    row.get_by_role("button", name="Load").click()
    expect(row).to_contain_text("loaded", timeout=30_000)
    expect(ui.get_by_test_id("running-table")).to_contain_text("pullme:latest")
    ui.screenshot(path=shots / "models.png")
    row.get_by_role("button", name="Unload").click()
    expect(row).to_contain_text("on disk", timeout=30_000)
    # Copy asks for the new name (a prompt), delete asks to confirm.
    ui.on("dialog", lambda d: d.accept("pullcopy") if d.type == "prompt" else d.accept())
    row.get_by_role("button", name="Copy").click()
    copied = ui.locator("tr[data-model='pullcopy:latest']")
    expect(copied).to_be_visible()
    for name, locator in (("pullme:latest", row), ("pullcopy:latest", copied)):
        ui.get_by_test_id(f"delete-{name}").click()
        expect(locator).to_have_count(0)


def test_metrics_page_moves_after_a_request_and_shows_a_bench_profile(ui, server, shots, bench_profile):
    ui.goto(ui.url.split("#")[0] + "#/metrics")
    total = ui.get_by_test_id("total-generation")
    expect(total).not_to_have_text("")
    before = int(total.inner_text())
    httpx.post(server + "/api/generate", timeout=60,
               json={"model": "alpha", "prompt": "count", "stream": False, "options": {"num_predict": 8}})
    wait_for(lambda: int(total.inner_text()) > before, 10, "the generated-tokens total to move")
    profile = bench_profile()
    ui.get_by_test_id("profile-file").set_input_files(str(profile))
    rows = ui.get_by_test_id("profile-table").locator("tbody tr")
    ops = [r["op"] for r in json.loads(profile.read_text())["profile"]]
    expect(rows).to_have_count(len(ops))
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(len(ops))] == ops
    ui.set_viewport_size({"width": 1280, "height": 1150})
    ui.screenshot(path=shots / "metrics.png")


def test_a_log_line_appears_in_the_logs_page_and_filters_work(ui, server, shots):
    ui.goto(ui.url.split("#")[0] + "#/logs")
    expect(ui.get_by_test_id("log-count")).to_contain_text("live")
    httpx.post(server + "/api/embed", json={"model": "alpha", "input": "log me"}, timeout=60)
    embed_line = ui.get_by_test_id("log-line").filter(has_text="/api/embed")
    expect(embed_line.first).to_be_visible(timeout=10_000)
    ui.screenshot(path=shots / "logs.png")
    ui.get_by_test_id("log-search").fill("no line says this")
    expect(ui.get_by_test_id("log-line")).to_have_count(0)
    ui.get_by_test_id("log-search").fill("")
    ui.get_by_test_id("log-level").select_option("error")
    expect(embed_line).to_have_count(0)


def test_playgrounds_show_token_logprobs_a_cosine_matrix_and_tokens(ui, shots):
    ui.goto(ui.url.split("#")[0] + "#/playground")
    ui.get_by_test_id("embed-run").click()
    matrix = ui.get_by_test_id("cosine-matrix")
    expect(matrix.locator("tbody tr")).to_have_count(3, timeout=30_000)
    cells = matrix.locator("tbody td")
    expect(cells).to_have_count(9)
    assert [cells.nth(i).inner_text() for i in (0, 4, 8)] == ["1.000"] * 3
    ui.get_by_test_id("completion-run").click()
    tokens = ui.get_by_test_id("completion-tokens").locator(".tok")
    expect(tokens.first).to_be_visible(timeout=30_000)
    assert "p=" in tokens.first.get_attribute("title")
    ui.get_by_test_id("tokenize-input").fill("Hello tokenizer")
    ui.get_by_test_id("tokenize-run").click()
    pieces = ui.get_by_test_id("tokenize-tokens").locator(".tok:not(.special)")
    expect(pieces.first).to_be_visible(timeout=30_000)
    assert "".join(pieces.all_inner_texts()) == "Hello tokenizer"
    ui.set_viewport_size({"width": 1280, "height": 1000})
    ui.screenshot(path=shots / "playground.png")


MARKUP = ('<script>window.__xss = 1</script><img src="x" onerror="window.__xss = 2">'
          '<b>not bold</b>\n\nand **bold** and [a link](javascript:window.__xss=4)')


def test_markup_in_a_reply_and_in_a_file_name_shows_as_text(ui):
    # No model here can be made to emit markup, so this one reply is served at the network layer.
    body = "".join(json.dumps(c) + "\n" for c in (
        {"message": {"role": "assistant", "content": MARKUP[:40]}, "done": False},
        {"message": {"role": "assistant", "content": MARKUP[40:]}, "done": False},
        {"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 2, "eval_duration": 1000000},
    ))
    ui.route("**/api/chat", lambda route: route.fulfill(status=200, content_type="application/x-ndjson", body=body))
    evil_name = '<img src=x onerror="window.__xss=3">.txt'
    ui.locator("input[type=file]").set_input_files(
        {"name": evil_name, "mimeType": "text/plain", "buffer": b"file body"})
    expect(ui.locator(".chip")).to_contain_text(evil_name)
    send(ui, "show me markup")
    reply = ui.get_by_test_id("msg-assistant").last
    expect(reply).to_contain_text("<script>window.__xss = 1</script>")
    expect(reply).to_contain_text("<b>not bold</b>")
    assert reply.locator("strong").inner_text() == "bold"  # markdown itself still renders
    messages = ui.get_by_test_id("messages")
    assert messages.locator("script, img, b, iframe").count() == 0
    assert reply.locator("a").get_attribute("href") in (None, "")
    assert ui.evaluate("window.__xss") is None


def test_settings_show_the_config_and_the_palette_navigates(ui, shots):
    ui.goto(ui.url.split("#")[0] + "#/settings")
    expect(ui.get_by_test_id("server-config")).to_contain_text("max_body_bytes")
    ui.screenshot(path=shots / "settings.png")
    ui.keyboard.press("Control+k")
    palette = ui.get_by_test_id("palette")
    expect(palette).to_be_visible()
    palette.locator("input").fill("go to metrics")
    ui.screenshot(path=shots / "palette.png")
    palette.locator("input").press("Enter")
    expect(ui.get_by_test_id("total-generation")).to_be_visible()
    ui.keyboard.press("Control+Alt+4")
    expect(ui.get_by_test_id("log-box")).to_be_visible()
