"""An unexpected exception is a 500 in the API's error shape, and the client's keep-alive
connection survives it (Starlette's outermost handler re-raised after answering, and uvicorn
then dropped the connection: the ollama client's next request failed with a reset)."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from mlxr.server.app import install_error_handlers
from server_harness import free_port


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/api/boom")
    async def boom() -> dict:
        raise RuntimeError("a bug")

    @app.post("/v1/boom")
    async def boom_v1() -> dict:
        raise KeyError("a bug")

    @app.get("/api/peer")
    async def peer(request: Request) -> dict:
        return {"port": request.client.port}

    return app


@pytest.fixture(scope="module")
def base_url():
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_a_500_leaves_the_connection_usable(base_url, caplog):
    with httpx.Client(base_url=base_url) as client:
        before = client.get("/api/peer").json()["port"]
        with caplog.at_level("ERROR"):
            r = client.get("/api/boom")
        assert r.status_code == 500 and r.json() == {"error": "internal error"}
        assert "unhandled error on /api/boom" in caplog.text and "a bug" in caplog.text
        after = client.get("/api/peer")  # raised ReadError (connection reset) before
        assert after.status_code == 200 and after.json()["port"] == before  # the same connection


def test_a_500_under_v1_has_openai_error_shape(base_url):
    with httpx.Client(base_url=base_url) as client:
        r = client.post("/v1/boom", json={})
        assert r.status_code == 500
        assert r.json()["error"] == {"message": "internal error", "type": "internal_error", "param": None, "code": 500}
        assert client.get("/api/peer").status_code == 200
