"""`mlxr generate` and `mlxr run` as a user runs them (subprocesses)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import fixture_model

MLXR = [str(Path(sys.executable).parent / "mlxr")]


def run(args, **kw):
    return subprocess.run(MLXR + args, capture_output=True, text=True, timeout=120, **kw)


def test_generate_prints_the_completion():
    from mlxr import LLM, SamplingParams

    path = str(fixture_model("tiny-llama").gguf_path)
    res = run(["generate", "--model", path, "--max-tokens", "6", "Once upon a time"])
    assert res.returncode == 0, res.stderr
    want = LLM(path).generate("Once upon a time", SamplingParams(max_tokens=6, temperature=0))[0].outputs[0].text
    assert res.stdout == want + "\n"


def test_generate_reports_a_missing_model_cleanly():
    res = run(["generate", "--model", "/nonexistent/model.gguf", "hi"])
    assert res.returncode == 2 and "not found" in res.stderr and "Traceback" not in res.stderr


def test_run_chats_and_streams_until_bye():
    path = str(fixture_model("tiny-llama").gguf_path)
    res = run(["run", path, "--max-tokens", "5"], input="Hello there\nAnd again\n/bye\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(">>> ") == 3  # two turns answered, then the prompt that read /bye
    assert "chatting with" in res.stderr


def test_bench_profile_breaks_a_step_into_ops(tmp_path):
    import json

    path = str(fixture_model("tiny-llama").gguf_path)
    out = tmp_path / "bench.json"
    res = run(["bench", "--model", path, "--prompt-len", "16", "--gen-len", "4", "--profile", "--json", str(out)])
    assert res.returncode == 0, res.stderr
    figures = json.loads(out.read_text())
    ops = {row["op"]: row for row in figures["profile"]}
    assert {"attention (paged)", "attn matmuls", "mlp matmuls", "lm_head", "rmsnorm"} <= set(ops)
    assert ops["attention (paged)"]["calls"] == 2 * figures["profiled_forwards"]  # two layers a pass
    assert figures["profiled_forwards"] == figures["steps"] == 3  # decode only: gen 4, first token in prefill
    assert figures["decode_tok_s"] > 0 and "ms/step" in res.stdout


def test_generate_finds_registry_names(tmp_path):
    import os

    env = {**os.environ, "MLXR_HOME": str(tmp_path)}
    path = str(fixture_model("tiny-llama").gguf_path)
    assert run(["import", path, "--name", "tiny:test"], env=env).returncode == 0
    by_name = run(["generate", "--model", "tiny:test", "--max-tokens", "4", "Hello"], env=env)
    by_path = run(["generate", "--model", path, "--max-tokens", "4", "Hello"], env=env)
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout == by_path.stdout
