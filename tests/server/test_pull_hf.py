"""`mlxr pull hf.co/...` and Ollama's /api/pull against a fake hub served over real HTTP."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ollama
import pytest
from model_fixtures import fixture_model
from fake_hub import COMMIT, FakeHub, FakeRepo
from server_harness import free_port, running_server

from mlxr.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
REPO = "test-org/Tiny-Llama-GGUF"
NAME = "hf.co/test-org/tiny-llama-gguf:f32"


def _hub_env(hub: FakeHub, home: Path) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home / "hf-home"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _pull_cmd(ref: str, home: Path) -> list[str]:
    return [sys.executable, "-m", "mlxr.cli", "pull", ref, "--home", str(home)]


def _gguf_repo(**kw) -> FakeRepo:
    data = fixture_model("tiny-llama").gguf_path.read_bytes()
    # A second quant that must never be fetched.
    return FakeRepo({"Tiny-Llama.F32.gguf": data, "Tiny-Llama.Q4_K_M.gguf": b"not this one", "README.md": b"hi"}, **kw)


def test_pull_resumes_after_the_process_is_killed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.repos[REPO] = _gguf_repo()
        size = len(hub.repos[REPO].files["Tiny-Llama.F32.gguf"])
        hub.chunk, hub.delay_s = 8 << 10, 0.02
        env = _hub_env(hub, home)
        proc = subprocess.Popen(_pull_cmd(f"hf.co/{REPO}:F32", home), env=env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        partial = home / "models" / "hf.co" / REPO / COMMIT / "Tiny-Llama.F32.gguf.partial"
        deadline = time.monotonic() + 60
        while not (partial.is_file() and partial.stat().st_size > size // 4):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        kept = partial.stat().st_size
        assert 0 < kept < size
        hub.chunk, hub.delay_s = 64 << 10, 0.0
        done = subprocess.run(_pull_cmd(f"hf.co/{REPO}:F32", home), env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        second = hub.downloads("Tiny-Llama.F32.gguf")[-1]
        assert second.range == f"bytes={kept}-" and second.sent == size - kept
        assert not hub.downloads("Tiny-Llama.Q4_K_M.gguf")
    # Progress off a terminal: stages and tenths of the transfer.
    assert "pulling manifest" in done.stderr and "100% of" in done.stderr
    assert "verifying sha256 digest" in done.stderr
    record = Registry(home).resolve(NAME)
    want = hashlib.sha256(fixture_model("tiny-llama").gguf_path.read_bytes()).hexdigest()
    assert record.digest == f"sha256:{want}" and not partial.exists()
    assert record.projector is None  # no mmproj in the repository: a text model, as before


def test_pull_refuses_a_checksum_mismatch(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.repos[REPO] = _gguf_repo(listed_sha256={"Tiny-Llama.F32.gguf": "ab" * 32})
        done = subprocess.run(_pull_cmd(f"hf.co/{REPO}:F32", home), env=_hub_env(hub, home), cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "does not match its checksum" in done.stderr
    assert Registry(home).list() == []
    assert not list((home / "models").rglob("*.gguf*"))


def test_pull_unknown_quant_names_the_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with FakeHub() as hub:
        hub.repos[REPO] = _gguf_repo()
        done = subprocess.run(_pull_cmd(f"hf.co/{REPO}:Q2_K", home), env=_hub_env(hub, home), cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "no GGUF file for 'Q2_K'" in done.stderr and "Q4_K_M" in done.stderr


def test_ollama_pull_streams_progress_and_serves_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = fixture_model("tiny-llama")
    with FakeHub() as hub:
        hub.repos[REPO] = _gguf_repo()
        hub.repos["test-org/tiny-llama-hf"] = FakeRepo({p.name: p.read_bytes() for p in tiny.hf_dir.iterdir()})
        for key, value in _hub_env(hub, tmp_path).items():
            monkeypatch.setenv(key, value)  # the server subprocess inherits them
        with running_server(tmp_path / "srv", "--model", str(tiny.gguf_path)) as url:
            client = ollama.Client(host=url)
            events = list(client.pull(f"hf.co/{REPO}:F32", stream=True))
            statuses = [e.status for e in events]
            assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
            transfer = [e for e in events if e.total]
            assert transfer and transfer[-1].completed == transfer[-1].total and transfer[-1].digest.startswith("sha256:")
            assert NAME in [m.model for m in client.list().models]
            assert client.generate(model=NAME, prompt="hi", options={"num_predict": 3}).done
            # A safetensors repository: the checkpoint directory.
            assert client.pull("hf.co/test-org/tiny-llama-hf").status == "success"
            shown = client.show("hf.co/test-org/tiny-llama-hf")
            assert shown.details.format == "safetensors"
            with pytest.raises(ollama.ResponseError) as missing:
                client.pull("hf.co/test-org/absent")
            assert missing.value.status_code == 404


def test_ollama_pull_without_a_hub_is_an_error_not_a_cut_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at HF_ENDPOINT (a machine offline): streaming, the pull ends with an error
    line (it was cut off after "pulling manifest", an incomplete chunked read for the client);
    not streaming, a 502 naming the hub (it was a 500), and the connection serves on."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with running_server(tmp_path / "srv", "--model", str(fixture_model("tiny-llama").gguf_path)) as url:
        client = ollama.Client(host=url)
        with pytest.raises(ollama.ResponseError) as streamed:
            list(client.pull("hf.co/test-org/absent", stream=True))
        assert "cannot reach the hub" in str(streamed.value)
        with pytest.raises(ollama.ResponseError) as whole:
            client.pull("hf.co/test-org/absent")
        assert whole.value.status_code == 502 and "cannot reach the hub" in str(whole.value)
        assert client.list().models  # the same client's next request
