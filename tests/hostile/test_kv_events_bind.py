"""`mlxr serve --kv-events-endpoint` at an address others can reach: refused before any model
loads unless --kv-events-allow-remote says so (the events carry every prompt's token ids); a
malformed address and a replay socket without a publisher are refused too, naming the flag."""
from __future__ import annotations

import os
import subprocess

import pytest

from model_fixtures import fixture_model
from server_harness import ROOT, free_port, server_command

from mlxr.config import EngineConfig
from mlxr.errors import InvalidParameterError


def refused(tmp_path, *flags: str) -> str:
    gguf = str(fixture_model("tiny-llama").gguf_path)
    cmd = server_command(tmp_path / "home", free_port(), "--model", gguf, *flags)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "MLXR_HOME": str(tmp_path / "home")})
    assert done.returncode == 2, done.stderr[-2000:]  # serve's own refusal, not a failed start-up
    assert "Traceback" not in done.stderr
    return done.stderr


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:5557", "tcp://*:5557", "tcp://[::]:5557",
                                      "tcp://eth0:5557", "tcp://example.com:5557", "tcp://10.1.2.3:5557"])
def test_a_reachable_address_is_refused(tmp_path, endpoint):
    err = refused(tmp_path, "--kv-events-endpoint", endpoint)
    assert err.startswith("error: --kv-events-endpoint: ") and "--kv-events-allow-remote" in err


def test_the_replay_address_is_checked_too(tmp_path):
    err = refused(tmp_path, "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
                  "--kv-events-replay-endpoint", "tcp://0.0.0.0:5558")
    assert err.startswith("error: --kv-events-replay-endpoint: ")


@pytest.mark.parametrize("endpoint", ["127.0.0.1:5557", "tcp://127.0.0.1", "tcp://127.0.0.1:99999",
                                      "udp://127.0.0.1:5557", "ipc://"])
def test_a_malformed_address_is_refused(endpoint):
    with pytest.raises(InvalidParameterError, match="kv_events_endpoint: .* is not tcp://HOST:PORT"):
        EngineConfig(kv_events_endpoint=endpoint)


def test_loopback_and_explicit_remote_pass():
    for endpoint in ("tcp://127.0.0.1:5557", "tcp://localhost:5557", "tcp://[::1]:5557", "ipc:///tmp/kv"):
        EngineConfig(kv_events_endpoint=endpoint)
    EngineConfig(kv_events_endpoint="tcp://*:5557", kv_events_allow_remote=True)
    with pytest.raises(InvalidParameterError, match="needs kv_events_endpoint"):
        EngineConfig(kv_events_replay_endpoint="tcp://127.0.0.1:5558")
