"""Where `mlxr run` reads its input: prompt_toolkit on a terminal (line editing, history with
the arrow keys, Alt-Enter for a new line), plain lines from a pipe. Both take Ollama's
triple-quote blocks for multi-line messages."""
from __future__ import annotations

import sys
from typing import Protocol

PROMPT = ">>> "
CONTINUATION = "... "
FENCE = '"""'


class Reader(Protocol):
    def read_line(self, prompt: str) -> str:
        """Raises EOFError at the end (Ctrl-D) and KeyboardInterrupt for Ctrl-C."""
        ...


def open_reader() -> Reader:
    if sys.stdin.isatty() and sys.stdout.isatty():
        return _TerminalReader()
    return _PipeReader()


def read_message(reader: Reader) -> str:
    """One message: a line, or everything between two \"\"\" fences."""
    line = reader.read_line(PROMPT)
    if not line.lstrip().startswith(FENCE):
        return line
    text = line.lstrip()[len(FENCE):]
    while not text.rstrip().endswith(FENCE):
        text += "\n" + reader.read_line(CONTINUATION)
    return text.rstrip()[: -len(FENCE)].strip("\n")


class _PipeReader:
    def read_line(self, prompt: str) -> str:
        return input(prompt)


class _TerminalReader:
    def __init__(self) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        keys = KeyBindings()

        @keys.add("escape", "enter")  # Alt-Enter: a new line inside the message
        def _newline(event) -> None:
            event.current_buffer.insert_text("\n")

        self.session = PromptSession(history=InMemoryHistory(), key_bindings=keys)

    def read_line(self, prompt: str) -> str:
        return self.session.prompt(prompt)
