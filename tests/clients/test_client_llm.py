"""Simon Willison's `llm` with the llm-ollama plugin against the server's Ollama API: the plugin
reads the model's capabilities from /api/show (it refuses tools unless "tools" is there), and a
tool runs: its CLI (`llm -m ollama/<model> -T llm_time`) and its Python API, tool result and
answer included. llm sends the schema with the first prompt of a chain only, so the JSON call
is made on the first turn and the answer after the tool result is the model's own text."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from client_server import MODEL, call_schema

LLM = Path(sys.executable).parent / "llm"
LLM_MODEL = "ollama/" + MODEL.removesuffix(":latest")
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
ADD_ARGUMENTS = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                  "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                 "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm_env(client_server_url, tmp_path_factory) -> dict[str, str]:
    # Only this plugin (others installed beside it need libraries of their own); llm's database
    # and the plugin's capability cache in a folder of the test.
    return {"LLM_USER_PATH": str(tmp_path_factory.mktemp("llm-home")), "LLM_LOAD_PLUGINS": "llm-ollama",
            "OLLAMA_HOST": client_server_url}


def run_llm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LLM), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=180)


def test_llm_ollama_lists_the_model_as_tool_capable(llm_env):
    listed = run_llm(llm_env, "ollama", "models")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith(MODEL)]
    assert row.split(None, 2)[2].replace(" ", "").split(",") == ["completion", "tools"]
    models = run_llm(llm_env, "models")
    assert f"Ollama: {LLM_MODEL}:latest" in models.stdout, models.stdout


def test_llm_cli_runs_the_llm_time_tool(llm_env):
    done = run_llm(llm_env, "-m", LLM_MODEL, "-T", "llm_time", "--td", "--no-log", "-o", "temperature", "0",
                   "--schema", json.dumps(call_schema("llm_time", NO_ARGUMENTS)), "what time is it")
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "Tool call: llm_time({})" in out, out
    assert '"utc_time_iso"' in out  # the tool's own reply, printed by --td


def test_llm_python_api_round_trip(llm_env, monkeypatch):
    for name, value in llm_env.items():
        monkeypatch.setenv(name, value)
    assert "llm" not in sys.modules, "llm reads LLM_LOAD_PLUGINS when imported"
    import llm

    model = llm.get_model(LLM_MODEL)
    assert model.supports_tools and model.supports_schema
    seen = []

    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append((a, b))
        return a + b

    chain = model.chain("Add two numbers.", tools=[add], schema=call_schema("add", ADD_ARGUMENTS),
                        options={"temperature": 0, "num_predict": 120})
    first, second = list(chain.responses())
    (call,) = first.tool_calls()
    assert call.name == "add" and seen == [(call.arguments["a"], call.arguments["b"])]
    (result,) = second.prompt.tool_results
    assert result.tool_call_id == call.tool_call_id and result.output == str(sum(seen[0]))
    assert second.text() and not second.tool_calls()
