"""The server's own first requests: at start, after the models are loaded, a streamed and a
plain completion of a one-word prompt through the server's routes, in this process (over ASGI, no
socket), and the chat template rendered once, so the first user's request does not pay one-off
costs of the request path (the routes' first validation and serialisation, the tokenizer's and
the template's first use, the first messages to the engine core, the detokenizer). On one H200 a
restarted server's first request with a 4,130-token prefix on its disk tier took 30-45 ms
without them and 13-14 ms with them, its repeat 11-14 ms (kv_tiers-20261128T005838Z, -010507Z).

They are not the users' traffic: no histogram, request log line or engine counter counts them
(the header carries a secret of this process), and a failure only logs. The prompt is shorter
than a KV block, so no block of it reaches the prefix cache or a KV tier (a chat request would
leave its template's first block on the disk tier: hence the template is rendered, not sent)."""
from __future__ import annotations

import asyncio
import logging
import secrets
import time

import httpx
from fastapi import FastAPI, Request

from mlxr.server.chat_plan import plan_chat

log = logging.getLogger(__name__)

HEADER = "x-mlxr-warm-up"
TIMEOUT_S = 120.0  # a request of 2 tokens; a large model on a slow CPU still fits
PROMPT = "Hello"
ROUTES = (
    ("/v1/completions", {"prompt": PROMPT, "stream": True}),
    ("/v1/completions", {"prompt": PROMPT}),
)


def install(app: FastAPI) -> None:
    app.state.warm_up_token = secrets.token_hex(16)


def is_warm_up(request: Request) -> bool:
    token = getattr(request.app.state, "warm_up_token", None)
    sent = request.headers.get(HEADER)
    return token is not None and sent is not None and secrets.compare_digest(sent, token)


def _headers(app: FastAPI) -> dict[str, str]:
    headers = {HEADER: app.state.warm_up_token}
    keys = app.state.config.api_keys
    if keys:
        headers["Authorization"] = f"Bearer {keys[0]}"
    return headers


async def warm_up(app: FastAPI, served: list) -> None:
    """Send ROUTES' requests to each served model (model_manager.ServedModel), then start its
    engine's counters over."""
    t0, transport = time.perf_counter(), httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=_headers(app),
                                 timeout=TIMEOUT_S) as client:
        for model in served:
            for path, body in ROUTES:
                await _send(client, path, {"model": model.name, "max_tokens": 2, "temperature": 0.0, **body})
            await asyncio.to_thread(_render_chat, model.tokenizer)
            try:
                # Under --api-servers N the core is shared and each API process warms up at its
                # own time: a base taken by one would hide another's users, so there the core's
                # counters keep the N warm-ups' few tokens.
                model.engine.forget_counts(core=app.state.config.api_servers <= 1)
            except Exception as e:  # noqa: BLE001 - the counts are worth a log line, never the start
                log.warning("warm-up: counters not reset: %s: %s", type(e).__name__, e)
    if served:
        log.info("warm-up: %d requests through the API in %.0f ms", len(served) * len(ROUTES),
                 1e3 * (time.perf_counter() - t0))


def _render_chat(tokenizer) -> None:
    try:
        plan_chat(tokenizer, [{"role": "user", "content": PROMPT}], None)
    except Exception as e:  # noqa: BLE001 - a model without a chat template
        log.info("warm-up: no chat template rendered: %s: %s", type(e).__name__, e)


async def _send(client: httpx.AsyncClient, path: str, body: dict) -> None:
    try:
        # ASGITransport applies no httpx timeout: a wedged engine must not hold the start.
        r = await asyncio.wait_for(client.post(path, json=body), TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - a warm-up is worth a log line, never the start
        log.warning("warm-up request to %s failed: %s: %s", path, type(e).__name__, e)
        return
    if r.status_code != 200:
        log.info("warm-up request to %s: HTTP %d %s", path, r.status_code, r.text[:200])
