"""A local stand-in for the Hugging Face hub, over real HTTP, for pull tests.

It answers what huggingface_hub and mlxr.pull ask: `GET /api/models/OWNER/REPO[/revision/REV]`
(model_info with `blobs=True`: commit sha and siblings with size, blobId and LFS sha256) and
`GET/HEAD /OWNER/REPO/resolve/REV/PATH` (ETag, X-Repo-Commit, Content-Length, Range -> 206).
Transfers can be slowed (to kill a client mid-download), or cut short: with `short_by` set, every
GET of a file ignores Range and answers 200 with all but the file's last `short_by` bytes (its
Content-Length saying so), and `short_step` bytes fewer are cut at each answer after. Every
request is recorded.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_LFS = (".gguf", ".safetensors", ".bin")


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    listed_sha256: dict[str, str] = field(default_factory=dict)  # overrides: a wrong checksum


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    sent: int = 0


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[Seen] = []
        self.chunk = 1 << 20
        self.delay_s = 0.0
        self.short_by = 0
        self.short_step = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def downloads(self, name: str) -> list[Seen]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + name)]

    def info(self, repo_id: str) -> dict:
        repo = self.repos[repo_id]
        siblings = []
        for name, data in repo.files.items():
            entry = {"rfilename": name, "size": len(data), "blobId": _git_sha1(data)}
            if name.endswith(_LFS):
                sha = repo.listed_sha256.get(name, hashlib.sha256(data).hexdigest())
                entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
            siblings.append(entry)
        return {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "private": False, "siblings": siblings}


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_INFO = re.compile(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/?]+))?")
_RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            seen = Seen(self.command, path, self.headers.get("Range"))
            hub.requests.append(seen)
            if m := _INFO.fullmatch(path):
                if m.group(1) not in hub.repos:
                    return self._send(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                return self._send(200, json.dumps(hub.info(m.group(1))).encode(), {"Content-Type": "application/json"})
            m = _RESOLVE.fullmatch(path)
            repo = hub.repos.get(m.group(1)) if m else None
            data = repo.files.get(m.group(3)) if repo else None
            if data is None:
                return self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})
            self._file(data, body, seen)

        def _file(self, data: bytes, body: bool, seen: Seen) -> None:
            headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": COMMIT,
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            start = 0
            if hub.short_by > 0 and body:
                data = data[:len(data) - hub.short_by]
                hub.short_by = max(1, hub.short_by - hub.short_step)
            elif seen.range and (m := re.fullmatch(r"bytes=(\d+)-", seen.range)):
                start = int(m.group(1))
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            status = 206 if start else 200
            headers["Content-Length"] = str(len(data) - start)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if not body:
                return
            try:
                for i in range(start, len(data), hub.chunk):
                    self.wfile.write(data[i:i + hub.chunk])
                    self.wfile.flush()
                    seen.sent += len(data[i:i + hub.chunk])
                    time.sleep(hub.delay_s)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(payload))}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler
