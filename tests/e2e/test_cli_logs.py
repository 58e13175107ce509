"""Log lines: readable on a terminal, JSON with --log-format json or when stderr is a pipe."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from model_fixtures import fixture_model
from server_harness import free_port, server_process
from tmux_terminal import Terminal

MLXR = str(Path(sys.executable).parent / "mlxr")
ROOT = Path(__file__).resolve().parents[2]
STARTED = "Application startup complete"


def _serve_in_terminal(home: Path, *extra: str) -> str:
    gguf = str(fixture_model("tiny-llama").gguf_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLXR_HOME": str(home)}
    t = Terminal([MLXR, "serve", "--port", str(free_port()), "--model", gguf, *extra], env, str(ROOT))
    try:
        return t.wait_for(lambda s: STARTED in s, timeout=90)
    finally:
        t.close()


def test_terminal_gets_readable_lines(tmp_path):
    screen = _serve_in_terminal(tmp_path)
    started = next(line for line in screen.splitlines() if STARTED in line)
    assert "INFO" in started and not started.lstrip().startswith("{")


def test_log_format_json_on_a_terminal(tmp_path):
    screen = _serve_in_terminal(tmp_path, "--log-format", "json")
    started = next(line for line in screen.splitlines() if STARTED in line)
    assert json.loads(started)["level"] == "info"


def test_a_pipe_gets_json(tmp_path):
    gguf = str(fixture_model("tiny-llama").gguf_path)
    with server_process(tmp_path, "--model", gguf):
        pass
    lines = [line for line in (tmp_path / "server.log").read_text().splitlines() if line.strip()]
    assert lines and all(json.loads(line)["msg"] is not None for line in lines)


def test_quantize_and_import_show_bars_on_a_terminal(tmp_path):
    src = str(fixture_model("tiny-qwen2").hf_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLXR_HOME": str(tmp_path / "home")}
    out = str(tmp_path / "q.gguf")
    t = Terminal([MLXR, "quantize", src, "--type", "q8_0", out, "--register", "tiny:q8"], env, str(ROOT))
    try:
        screen = t.wait_for(lambda s: "EXIT=" in s, timeout=90)
    finally:
        t.close()
    assert "EXIT=0" in screen and "wrote" in screen and "registered tiny:q8" in screen
    assert "[ 1/" not in screen  # the per-tensor lines are for pipes; a terminal gets the bar
