"""`mlxr serve` before it serves anything: its help, a port another server holds, a model path
that is not there (subprocesses, as a user runs them)."""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

MLXR = [str(Path(sys.executable).parent / "mlxr")]


def run(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(MLXR + args, capture_output=True, text=True, timeout=timeout, **kw)


def _serve_parser() -> argparse.ArgumentParser:
    from mlxr.cli.main import build_parser

    parser, _ = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_every_serve_option_has_help_and_shows_its_default() -> None:
    serve = _serve_parser()
    for action in serve._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings
    assert serve.formatter_class is argparse.ArgumentDefaultsHelpFormatter


def test_serve_help_lists_the_defaults() -> None:
    res = run(["serve", "--help"])
    text = " ".join(res.stdout.split())  # argparse wraps lines
    assert res.returncode == 0
    for shown in ("(default: 11434)", "(default: 127.0.0.1)", "--max-tokens-default", "(default: 2048)"):
        assert shown in text


def test_a_taken_port_fails_at_once_with_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        start = time.monotonic()
        res = run(["serve", "--port", str(port), "--home", str(tmp_path)], timeout=30)
        took = time.monotonic() - start
    assert res.returncode != 0
    assert res.stderr.strip() == (f"error: port {port} on 127.0.0.1 is already in use (another mlxr or ollama "
                                  "serve?); pick another with --port")
    assert took < 2.0  # the bundled models are not loaded first


def test_a_taken_port_is_found_without_importing_torch(tmp_path: Path) -> None:
    """Torch's import alone takes seconds on a busy 2-core host: none of it before the check."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        argv = ["mlxr", "serve", "--port", str(holder.getsockname()[1]), "--home", str(tmp_path)]
        code = (f"import sys; from mlxr.cli import main; sys.argv = {argv!r}; rc = main(); "
                "print(rc, 'torch' in sys.modules)")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["2", "False"], res.stderr


@pytest.mark.parametrize(("args", "path"), [
    (["serve", "--model", "/missing/path"], "/missing/path"),
    (["serve", "--model", "./missing.gguf"], "./missing.gguf"),
    (["generate", "--model", "/missing/path", "hi"], "/missing/path"),
    (["run", "/missing/path"], "/missing/path"),
])
def test_a_missing_model_path_is_named_as_such(args: list[str], path: str, tmp_path: Path) -> None:
    from server_harness import free_port

    extra = ["--port", str(free_port()), "--home", str(tmp_path)] if args[0] == "serve" else []
    res = run([*args, *extra], timeout=60, cwd=tmp_path, input="")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == f"error: no such file or directory: {path}"
