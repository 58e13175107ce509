"""A local PEP 503 package index over real HTTP, serving wheels built in the test."""
from __future__ import annotations

import base64
import hashlib
import io
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], tamper: str | None = None) -> Path:
    """A py3-none-any wheel of `files` (paths inside it). `tamper`: a file whose RECORD hash
    is made wrong."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    members = {**files,
               f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
               f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [f"{p},{_record_hash(b'x' if p == tamper else d)},{len(d)}" for p, d in members.items()]
    members[f"{dist}/RECORD"] = ("\n".join(rows + [f"{dist}/RECORD,,"]) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in members.items():
            zf.writestr(path, data)
    pkg = folder / "simple" / name
    pkg.mkdir(parents=True, exist_ok=True)
    wheel = pkg / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    wheel.write_bytes(buf.getvalue())
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    links = "".join(f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
                    for w in sorted(pkg.glob("*.whl")))
    (pkg / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    assert digest
    return wheel


class FakeIndex:
    """Serves `root` (with its simple/ tree) on 127.0.0.1; `url` is the index URL for pip."""

    def __init__(self, root: Path) -> None:
        handler = partial(_Quiet, directory=str(root))
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/simple/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeIndex:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass
