"""The loading state of a real model load: the bundled Gemma 3 270M, unloaded, then asked for in
the web UI's chat (Debian's chromium, Playwright) takes seconds to load again; the reply shows the
stage, the seconds so far and the estimate from its first load, with a bar, then the answer, and
the chat marks the model as a base model."""
from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright
from server_harness import running_server
from webui_browser import ConsoleErrors, launch

MODEL = "gemma3-270m:latest"


@pytest.mark.slow  # the bundled model loads twice: about a minute on 2 cores
def test_a_real_model_load_shows_its_stage_time_and_estimate(tmp_path):
    with running_server(tmp_path / "home", timeout_s=240) as url, sync_playwright() as p:  # the bundled models
        assert httpx.post(url + "/api/generate", json={"model": MODEL, "keep_alive": 0}, timeout=60).status_code == 200
        assert MODEL not in [m["name"] for m in httpx.get(url + "/api/ps").json()["models"]]
        browser = launch(p)
        context = browser.new_context(viewport={"width": 1280, "height": 760})
        sampling = {"temperature": 0, "top_p": 1, "top_k": 1, "num_predict": 8, "seed": "1"}
        context.add_init_script(f"""localStorage.setItem('mlxr.model', {json.dumps(MODEL)});
            localStorage.setItem('mlxr.sampling', {json.dumps(json.dumps(sampling))});""")
        ui = context.new_page()
        errors = ConsoleErrors(ui)
        ui.goto(url + "/ui/#/chat")
        ui.get_by_test_id("chat-input").fill("The sky is")
        ui.get_by_test_id("chat-input").press("Enter")
        loading = ui.locator("[data-testid=model-loading][data-stage=loading]")
        expect(loading).to_be_visible(timeout=15_000)
        expect(loading).to_contain_text(f"Loading model {MODEL}")
        expect(loading).to_contain_text("(its last load)")  # the estimate from the load at start
        ui.screenshot(path=tmp_path / "bundled-loading.png")
        print(f"\nscreenshot: {tmp_path / 'bundled-loading.png'}")
        expect(ui.get_by_test_id("msg-assistant").last.get_by_test_id("reply-stats")).to_contain_text("tok/s", timeout=120_000)
        expect(ui.get_by_test_id("model-loading")).to_have_count(0)
        expect(ui.get_by_test_id("base-model-note")).to_be_visible()  # a base model: steered to completion
        ui.screenshot(path=tmp_path / "bundled-answered.png")
        context.close()
        browser.close()
        assert errors.unexpected() == []
