"""One llama-server process for a bench: started on 127.0.0.1 at a free port with one slot and a
fixed context, waited for, asked for greedy completions of token ids, and killed on exit (also
on error, and by the kernel if this process dies first: PR_SET_PDEATHSIG)."""
from __future__ import annotations

import ctypes
import json
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, binary: str, model: str, gpu: bool, threads: int, ctx: int, extra: list[str],
                 start_timeout: float = 180.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port), "-np", "1",
                     "-c", str(ctx), "-ngl", "99" if gpu else "0", "-t", str(threads), "-tb", str(threads),
                     "--no-webui", *extra]
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])

    def __enter__(self) -> LlamaServer:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent)
        try:
            self._wait_ready()
        except BaseException as e:
            tail = self.log_tail()
            self.close()
            raise RuntimeError(f"llama-server did not start: {e}\n{tail}") from e
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.unlink(missing_ok=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode})")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"llama-server not ready in {self.start_timeout:.0f} s")

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def complete(self, prompt_ids: list[int], max_tokens: int, timeout: float = 300.0) -> dict:
        """/completion of a token-id prompt, greedy, no prompt cache (every run prefills the same)."""
        body = {"prompt": prompt_ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "seed": 0,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        req = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
