"""Start a real `mlxr serve` subprocess for tests.

    with running_server(tmp_home, "--model", str(gguf), api_key="k") as base_url:
        httpx.get(base_url + "/health")

The server's stderr (JSON logs) goes to <tmp_home>/server.log; it is printed when start-up fails.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MLXR = ROOT / ".venv" / "bin" / "mlxr"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(home: Path, port: int, *extra_args: str, api_key: str | None = None) -> list[str]:
    exe = [str(MLXR)] if MLXR.exists() else [sys.executable, "-m", "mlxr.cli"]
    cmd = [*exe, "serve", "--port", str(port), "--home", str(home), *extra_args]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    return cmd


def _wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} during start-up")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"server not healthy after {timeout_s}s")


def stop_server(proc: subprocess.Popen, grace_s: float = 15.0) -> int:
    """SIGTERM, then SIGKILL if it has not exited within grace_s; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@contextlib.contextmanager
def server_process(
    tmp_home: Path, *extra_args: str, api_key: str | None = None, timeout_s: float = 120.0
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Like running_server, but also yields the process (to signal it)."""
    tmp_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "MLXR_HOME": str(tmp_home), "PYTHONUNBUFFERED": "1"}
    env.pop("MLXR_API_KEY", None)
    log_path = tmp_home / "server.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            server_command(tmp_home, port, *extra_args, api_key=api_key),
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )
        try:
            try:
                _wait_healthy(proc, url, timeout_s)
            except RuntimeError as e:
                tail = log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{e}\n--- server log ---\n{tail}") from None
            yield url, proc
        finally:
            stop_server(proc)


@contextlib.contextmanager
def running_server(
    tmp_home: Path, *extra_args: str, api_key: str | None = None, timeout_s: float = 120.0
) -> Iterator[str]:
    """Run `mlxr serve` on a free port with MLXR_HOME=tmp_home; yields the base URL."""
    with server_process(tmp_home, *extra_args, api_key=api_key, timeout_s=timeout_s) as (url, _):
        yield url


@contextlib.contextmanager
def tiny_llama_server(tmp_home: Path, *extra_args: str, api_key: str | None = None,
                      fixture: str = "tiny-llama") -> Iterator[str]:
    """running_server on a tiny random Llama fixture (GGUF), the server tests' model."""
    from model_fixtures import fixture_model

    gguf = str(fixture_model(fixture).gguf_path)
    with running_server(tmp_home, "--model", gguf, *extra_args, api_key=api_key) as url:
        yield url


def scrape(base_url: str) -> dict[str, float]:
    """Sample name with labels -> value, from the Prometheus text format of /metrics."""
    out = {}
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def server_log(tmp_home: Path) -> str:
    return (tmp_home / "server.log").read_text(errors="replace")
