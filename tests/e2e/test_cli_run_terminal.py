"""`mlxr run` in a real terminal (tmux): line editing and history, Ollama's commands."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from model_fixtures import fixture_model
from tmux_terminal import Terminal

MLXR = str(Path(sys.executable).parent / "mlxr")
ROOT = Path(__file__).resolve().parents[2]


def _prompts(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith(">>>"))


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@pytest.fixture
def terminal():
    opened = []

    def open_terminal(*args: str) -> Terminal:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t = Terminal([MLXR, *args], env, str(ROOT))
        opened.append(t)
        return t

    yield open_terminal
    for t in opened:
        t.close()


def test_history_set_parameter_and_bye(terminal):
    from mlxr import LLM, SamplingParams

    path = str(fixture_model("tiny-llama").gguf_path)
    greedy = LLM(path).chat([{"role": "user", "content": "Hello"}],
                            SamplingParams(max_tokens=8, temperature=0)).outputs[0].text.strip()
    t = terminal("run", path, "--max-tokens", "8", "--temperature", "2", "--seed", "3")
    t.wait_for(lambda s: _last_line(s) == ">>>")
    t.type_line("Hello")
    hot = t.wait_for(lambda s: _prompts(s) == 2 and _last_line(s) == ">>>")
    assert greedy not in hot  # temperature 2 samples something else

    t.send("Up")  # history: the line comes back for editing, not as keys to the model
    t.wait_for(lambda s: _last_line(s) == ">>> Hello")
    t.send("C-u")  # erase it
    t.wait_for(lambda s: _last_line(s) == ">>>")

    t.type_line("/set parameter temperature 0")
    t.wait_for(lambda s: "Set parameter 'temperature' to '0'" in s)
    t.type_line("/clear")
    t.wait_for(lambda s: "Cleared session context" in s and _last_line(s) == ">>>")
    t.type_line("Hello")
    cold = t.wait_for(lambda s: _prompts(s) == 5 and _last_line(s) == ">>>")
    assert greedy in cold.split("/clear", 1)[1]

    t.type_line("/bye")
    t.wait_for(lambda s: "EXIT=0" in s)


def test_ctrl_c_stops_the_reply_not_the_program(terminal):
    # The bundled model: a long reply takes seconds, time enough to interrupt it.
    t = terminal("run", "gemma3-270m", "--max-tokens", "2000")
    t.wait_for(lambda s: _last_line(s) == ">>>", timeout=120)
    asked = ">>> Write a very long story about a dragon."
    t.type_line(asked.removeprefix(">>> "))
    t.wait_for(lambda s: asked in s and len(s.split(asked, 1)[1].strip()) > 50)  # the reply is streaming
    t.send("C-c")
    t.wait_for(lambda s: _prompts(s) == 2 and _last_line(s) == ">>>")
    t.type_line("/show info")
    t.wait_for(lambda s: "architecture        gemma3" in s and _last_line(s) == ">>>")
    t.type_line("/bye")
    t.wait_for(lambda s: "EXIT=0" in s)
