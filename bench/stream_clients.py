"""The HTTP clients of bench/serve.py: one streamed POST each, its SSE events folded into an
Outcome by the caller's read_event. aiohttp where installed (it reads a stream with far less
Python per chunk than httpx: bench/probes/sse_client_ceiling.py), httpx to compare."""
from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson


@dataclass
class Outcome:
    """One streamed request: when it was sent, when each content chunk came, what ended it."""

    sent: float
    chunk_times: list[float] = field(default_factory=list)
    tokens: int = 0
    status: int | None = None
    error: str | None = None
    done: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and bool(self.chunk_times)

    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    def tpot(self) -> float | None:
        # A chunk may carry several tokens, so spread the decode time over the counted tokens.
        if self.tokens < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.tokens - 1)

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def summary(self) -> dict:
        ok = self.ok
        return {"status": self.status, "error": self.error, "tokens": self.tokens, "chunks": len(self.chunk_times),
                "ttft_s": self.ttft() if ok else None, "e2e_s": self.done - self.sent if ok else None}


ReadEvent = Callable[[Outcome, bytes], bool]  # folds one `data:` payload in; False once over


def read_events(out: Outcome, buffer: bytes, read_event: ReadEvent) -> tuple[bytes, bool]:
    """Fold the complete events in buffer into out; returns the incomplete rest and False once
    the stream is over."""
    *events, rest = buffer.split(b"\n\n")
    for event in events:
        for line in event.split(b"\n"):
            if line.startswith(b"data:") and not read_event(out, line[5:].strip()):
                return b"", False
    return rest, True


def finish(out: Outcome) -> Outcome:
    out.done = time.perf_counter()
    if out.status == 200 and out.error is None and not out.tokens:
        out.error = "stream ended without usage"
    return out


class HttpxClient:
    """bench/serve.py's first client; kept to compare (--client httpx)."""

    def __init__(self, timeout_s: float, read_event: ReadEvent) -> None:
        self.read_event = read_event
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits)

    async def __aenter__(self) -> "HttpxClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.aclose()

    async def send(self, url: str, body: dict) -> Outcome:
        out = Outcome(sent=time.perf_counter())
        try:
            async with self.client.stream("POST", f"{url}/v1/completions", json=body) as resp:
                out.status = resp.status_code
                if resp.status_code != 200:
                    out.error = (await resp.aread()).decode(errors="replace")[:300]
                    return finish(out)
                # Not aiter_lines: it also splits at the Unicode line breaks that JSON strings
                # may carry raw (U+2028, U+0085), which cut an event of random-model text apart.
                rest, going = b"", True
                async for data in resp.aiter_bytes():
                    rest, going = read_events(out, rest + data, self.read_event)
                    if not going:
                        break
        except httpx.HTTPError as e:
            out.error = f"{type(e).__name__}: {e}"
        return finish(out)


class AiohttpClient:
    """aiohttp reads a stream with far less Python per chunk than httpx (vLLM's
    benchmark_serving uses it too); each network read is split into its events."""

    def __init__(self, timeout_s: float, read_event: ReadEvent) -> None:
        import aiohttp

        self.read_event = read_event
        self.aiohttp = aiohttp
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(limit=0, force_close=False), read_bufsize=1 << 20)

    async def __aenter__(self) -> "AiohttpClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    async def send(self, url: str, body: dict) -> Outcome:
        out = Outcome(sent=time.perf_counter())
        try:
            async with self.session.post(f"{url}/v1/completions", data=orjson.dumps(body),
                                         headers={"content-type": "application/json"}) as resp:
                out.status = resp.status
                if resp.status != 200:
                    out.error = (await resp.read()).decode(errors="replace")[:300]
                    return finish(out)
                rest, going = b"", True
                async for data in resp.content.iter_any():
                    rest, going = read_events(out, rest + data, self.read_event)
                    if not going:
                        break
        except (self.aiohttp.ClientError, asyncio.TimeoutError) as e:
            out.error = f"{type(e).__name__}: {e}"
        return finish(out)


def client_kind(kind: str) -> str:
    """kind: "aiohttp", "httpx", or "auto" (aiohttp where installed)."""
    if kind == "auto":
        return "aiohttp" if importlib.util.find_spec("aiohttp") else "httpx"
    return kind


def make_client(kind: str, timeout_s: float, read_event: ReadEvent) -> HttpxClient | AiohttpClient:
    """Call from a coroutine (aiohttp binds its session to the running loop)."""
    cls = AiohttpClient if client_kind(kind) == "aiohttp" else HttpxClient
    return cls(timeout_s, read_event)
