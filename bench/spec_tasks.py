"""The speculation benches' tasks (bench/spec_decode.py, bench/peers/llama_spec.py), each a chat
the instruct model answers, in three classes: text rewrites, code edits, and an agent's
multi-turn session whose last turn has it reuse what its earlier tool calls returned."""
from __future__ import annotations

CODE = '''def moving_average(values, window):
    """Return the moving averages of values over a window."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''
TEXT = ("The library opens at nine in the morning and closes at six in the evening. Visitors may "
        "borrow up to five books at a time for three weeks. Late returns cost ten cents a day. The "
        "reading room on the second floor is quiet, and the children's corner is on the ground floor.")
CONFIG_PY = '''import json
from pathlib import Path

DEFAULTS = {"host": "127.0.0.1", "port": 8080, "workers": 4, "timeout": 30}


def load_config(path):
    """Read a JSON config file and fill in the defaults."""
    data = json.loads(Path(path).read_text())
    config = dict(DEFAULTS)
    for key, value in data.items():
        if key not in DEFAULTS:
            raise KeyError(f"unknown setting {key}")
        config[key] = value
    if config["port"] < 0 or config["port"] > 65535:
        raise ValueError("port out of range")
    if config["workers"] < 1:
        raise ValueError("workers must be at least 1")
    return config
'''
TEST_OUTPUT = '''============================= test session starts ==============================
collected 3 items

tests/test_config.py .F.                                                 [100%]

=================================== FAILURES ===================================
____________________________ test_timeout_is_a_float ___________________________
    def test_timeout_is_a_float():
        config = load_config("tests/data/timeout.json")
>       assert isinstance(config["timeout"], float)
E       assert False
E        +  where False = isinstance(30, float)
=========================== short test summary info ============================
FAILED tests/test_config.py::test_timeout_is_a_float - assert False
========================= 1 failed, 2 passed in 0.05s =========================='''


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


AGENT_SESSION = [
    {"role": "system", "content": "You are a coding agent. You run shell commands by writing run(\"...\"); "
                                  "the user replies with their output."},
    _user("The test suite fails. Find out why and fix it."),
    _assistant('First I run the tests.\nrun("pytest -q tests/test_config.py")'),
    _user(f"Tool output:\n{TEST_OUTPUT}"),
    _assistant('test_timeout_is_a_float fails: load_config returns the timeout as an int. I read the file.\n'
               'run("cat config.py")'),
    _user(f"Tool output:\n{CONFIG_PY}"),
    _assistant("The default timeout is the integer 30, so a config without a float timeout keeps an int."),
    _user("Write the whole of config.py again with the default timeout as 30.0 and load_config converting "
          "config[\"timeout\"] to a float before it returns. Reply with the code only."),
]

# (class, messages): every engine gets the same chat, rendered by the model's own template.
CLASSED_TASKS: list[tuple[str, list[dict]]] = [
    ("code-edit", [_user("Rename the function moving_average to rolling_mean and change nothing else. "
                         f"Reply with the code only.\n\n{CODE}")]),
    ("code-edit", [_user(f"Add type hints to this function; keep everything else the same. Reply with the code "
                         f"only.\n\n{CODE}")]),
    ("rewrite", [_user(f"Rewrite this notice, replacing 'library' with 'archive'. Keep every other word.\n\n{TEXT}")]),
    ("rewrite", [_user(f"Copy this text exactly, but in the present continuous where possible.\n\n{TEXT}")]),
    ("code-edit", [_user("Fix the bug: load_config must raise ValueError, not KeyError, for an unknown setting. "
                         f"Reply with the whole corrected file only.\n\n{CONFIG_PY}")]),
    ("agent", AGENT_SESSION),
]
TASKS = [messages for _, messages in CLASSED_TASKS]
TASK_CLASS = [cls for cls, _ in CLASSED_TASKS]
TASK_CLASSES = sorted(set(TASK_CLASS))


def chat_ids(tokenizer, messages: list[dict] | str) -> list[int]:
    """The chat (or one user turn) ready for the model's answer, as token ids: every engine,
    ours and the peer's, gets the same prompt."""
    if isinstance(messages, str):
        messages = [_user(messages)]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return tokenizer.encode(prompt, add_special_tokens=False)
