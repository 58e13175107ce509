"""Shared pieces of bench/soak.py and bench/kill9.py: a real `mlxr serve` on 127.0.0.1, its
process tree and RSS, a /health prober in its own thread, the engine gauges, one streamed chat
request (optionally dropped mid-stream), and the integrity checks of the registry and the KV
disk tier. Every loop here is bounded in count and in time."""
from __future__ import annotations

import asyncio
import os
import random
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # all traffic stays on this host
CHAT_MODEL = "smollm2:135m"
PROMPTS = ("Say hello.", "Name a colour.", "Count to five.", "What is two plus two?", "Write one short line.",
           "Give me a word that rhymes with cat.", "Tell me a fact about the sea.", "Name a fruit.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    home: Path
    log_path: Path


def start_server(home: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300.0) -> Server:
    """`python -m mlxr.cli serve` on a free loopback port with MLXR_HOME=home; returns once /health is 200."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    full_env = {**os.environ, "MLXR_HOME": str(home), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
                **(env or {})}
    full_env.pop("MLXR_API_KEY", None)
    log_path = home / "server.log"
    cmd = [sys.executable, "-m", "mlxr.cli", "serve", "--host", HOST, "--port", str(port), "--home", str(home), *args]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    server = Server(proc, f"http://{HOST}:{port}", home, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} during start-up; see {log_path}")
        if health_status(server.url, 2.0)[0] == 200:
            return server
        time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f}s; see {log_path}")


def stop_server(server: Server, grace_s: float = 30.0) -> int:
    """SIGTERM, then SIGKILL past grace_s; the exit status."""
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(10)
    return server.proc.returncode


def health_status(url: str, timeout_s: float) -> tuple[int | None, float]:
    t0 = time.perf_counter()
    try:
        code = httpx.get(url + "/health", timeout=timeout_s).status_code
    except httpx.HTTPError:
        code = None
    return code, time.perf_counter() - t0


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (alive now)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    total = 0
    for p in tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def children_running(pid: int, module: str) -> list[int]:
    found = []
    for p in tree(pid)[1:]:
        try:
            if module in " ".join(p.cmdline()):
                found.append(p.pid)
        except psutil.Error:
            pass
    return sorted(found)


def still_alive(pids: list[int]) -> list[int]:
    """Those of pids still running (a zombie counts as gone: its parent or init reaps it)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


class HealthProbe(threading.Thread):
    """GET /health every `every_s` in its own thread; records each answer's latency and status."""

    def __init__(self, url: str, every_s: float = 0.5, timeout_s: float = 5.0, max_probes: int = 20_000) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s, self.timeout_s, self.max_probes = url, every_s, timeout_s, max_probes
        self.samples: list[tuple[float, int | None, float]] = []  # (time, status, latency)
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            for _ in range(self.max_probes):
                if self.stopped.is_set():
                    return
                t0 = time.perf_counter()
                try:
                    code = client.get(self.url + "/health").status_code
                except httpx.HTTPError:
                    code = None
                latency = time.perf_counter() - t0
                self.samples.append((time.monotonic(), code, latency))
                self.stopped.wait(max(0.0, self.every_s - latency))

    def stop(self) -> None:
        self.stopped.set()
        self.join(self.timeout_s + 1)

    def figures(self) -> dict:
        latencies = [s[2] for s in self.samples]
        return {"probes": len(self.samples), "max_s": max(latencies, default=None),
                "over_1s": sum(x > 1.0 for x in latencies), "not_200": sum(s[1] != 200 for s in self.samples)}


def engine_gauges(url: str, model: str, timeout_s: float = 10.0) -> dict | None:
    """running, waiting and KV blocks in use of one model, from /admin/stats (None if unreadable)."""
    try:
        body = httpx.get(url + "/admin/stats", timeout=timeout_s).json()
        s = body["models"][model]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    return {"running": s["num_requests_running"], "waiting": s["num_requests_waiting"],
            "kv_blocks_used": s["kv_blocks_used"], "kv_blocks_cached": s["kv_blocks_cached"],
            "kv_blocks_total": s["kv_blocks_total"]}


def wait_drained(url: str, model: str, within_s: float) -> tuple[dict | None, float | None]:
    """The gauges once running, waiting and KV blocks in use are all 0 (and the seconds it took),
    or the last gauges read and None if they were not within within_s."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < within_s:
        last = engine_gauges(url, model)
        if last and last["running"] == last["waiting"] == last["kv_blocks_used"] == 0:
            return last, time.monotonic() - t0
        time.sleep(0.5)
    return last, None


@dataclass
class StreamResult:
    kind: str = "ok"  # ok | disconnected | failed
    error: str | None = None
    chunks: int = 0
    started: float = 0.0
    ended: float = 0.0
    first_chunk: float | None = None
    chunk_times: list[float] = field(default_factory=list)

    def longest_wait_after(self, t: float) -> float:
        """The longest the client went without news (a chunk, or the end) after time t."""
        marks = [t, *(c for c in self.chunk_times if c > t), max(self.ended, t)]
        return max(b - a for a, b in zip(marks, marks[1:]))


def chat_body(model: str, rng: random.Random, max_tokens: tuple[int, int] = (16, 64)) -> dict:
    return {"model": model, "stream": True, "max_tokens": rng.randint(*max_tokens), "temperature": 0.7,
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict, drop_after: int | None,
                      timeout_s: float, started: asyncio.Event | None = None) -> StreamResult:
    """One streamed chat completion. drop_after: close the connection after that many chunks
    (a client that goes away). Anything but a finished stream or a planned drop is a failure,
    named in .error."""
    out = StreamResult(started=time.monotonic())
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    out.kind, out.error = "failed", f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return out
                await _read_stream(resp, out, drop_after, started)
    except TimeoutError:
        out.kind, out.error = "failed", f"no end within {timeout_s:.0f}s"
    except (aiohttp.ClientError, ConnectionError) as e:
        out.kind, out.error = "failed", f"{type(e).__name__}: {e}"
    finally:
        out.ended = time.monotonic()
    return out


async def _read_stream(resp: aiohttp.ClientResponse, out: StreamResult, drop_after: int | None,
                       started: asyncio.Event | None) -> None:
    done = False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        event = orjson.loads(data)
        if "error" in event:
            out.kind, out.error = "failed", f"error event: {str(event['error'])[:200]}"
            return
        out.chunks += 1
        out.chunk_times.append(time.monotonic())
        if out.first_chunk is None:
            out.first_chunk = time.monotonic()
            if started is not None:
                started.set()
        if drop_after is not None and out.chunks >= drop_after:
            out.kind = "disconnected"
            resp.close()
            return
    if not done:
        out.kind, out.error = "failed", "stream ended without [DONE]"


def sqlite_check(path: Path, pragma: str) -> str:
    """'ok', or what SQLite's integrity_check / quick_check says (read-only)."""
    if not path.exists():
        return "missing"
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute(f"PRAGMA {pragma}").fetchall()
        finally:
            db.close()
    except sqlite3.Error as e:
        return f"{type(e).__name__}: {e}"
    return "; ".join(str(r[0]) for r in rows)


def registry_check(home: Path) -> str:
    from mlxr.registry.db import DB_FILE

    return sqlite_check(home / DB_FILE, "integrity_check")


@dataclass
class KvDiskCheck:
    index: str = "missing"
    block_files: int = 0
    bad_files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.index == "ok" and not self.bad_files


def kv_disk_check(root: Path, max_files: int = 100_000) -> KvDiskCheck:
    """The disk tier's index passes PRAGMA quick_check, and every block file passes the tier's own
    header check (block_file.check_header, under the directory's seal key) and its CRC-32."""
    from mlxr.engine.kv.disk_index import BLOCK_FILE, INDEX_NAME, LAYOUT_DIR

    out = KvDiskCheck(index=sqlite_check(root / INDEX_NAME, "quick_check"))
    if not root.is_dir():
        return out
    for layout_dir in sorted(p for p in root.iterdir() if LAYOUT_DIR.fullmatch(p.name) and p.is_dir()):
        for path in sorted(layout_dir.iterdir())[:max_files]:
            if BLOCK_FILE.fullmatch(path.name):
                out.block_files += 1
                problem = _block_problem(root, layout_dir.name, path)
                if problem:
                    out.bad_files.append(f"{path.name}: {problem}")
    return out


def _block_problem(root: Path, layout_name: str, path: Path) -> str | None:
    from mlxr.engine.kv.block_file import MAGIC, BlockRejected, Layout, check_header, header_limit, parse_header
    from mlxr.engine.kv.disk_dir import seal_key

    data = path.read_bytes()
    n = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    try:
        header = parse_header(data[len(MAGIC) + 4 : len(MAGIC) + 4 + n])
        layout = Layout(**{k: header[k] for k in Layout.__dataclass_fields__})
        if layout.key() != layout_name:
            return f"its layout is not its directory's ({layout.key()})"
        size = len(data) - (len(MAGIC) + 4 + n)
        start, crc = check_header(data[: len(MAGIC) + 4 + header_limit(layout)], layout,
                                  bytes.fromhex(path.stem), size, seal_key(root))
    except (BlockRejected, KeyError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    if zlib.crc32(data[start:]) != crc:
        return "payload CRC-32 mismatch"
    return None
