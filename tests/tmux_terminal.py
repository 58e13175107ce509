"""A real terminal for CLI tests: tmux on a private socket, driven by send-keys and read back
with capture-pane."""
from __future__ import annotations

import shlex
import subprocess
import time
import uuid

from debian_tools import ensure_commands


def ensure_tmux() -> str:
    """tmux's path; installs it with apt-get when missing, skips only when that fails."""
    return ensure_commands(["tmux"], ["tmux"])[0]


class Terminal:
    def __init__(self, command: list[str], env: dict[str, str], cwd: str) -> None:
        self.tmux = [ensure_tmux(), "-L", f"mlxr-test-{uuid.uuid4().hex[:8]}"]
        # Keep the pane after the command exits, so its exit status can be read.
        line = f"{shlex.join(command)}; echo EXIT=$?; sleep 600"
        subprocess.run([*self.tmux, "new-session", "-d", "-x", "160", "-y", "60", "-c", cwd, line],
                       env=env, check=True)

    def send(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", *keys], check=True)

    def type_line(self, text: str) -> None:
        self.send("-l", text)
        self.send("Enter")

    def screen(self) -> str:
        res = subprocess.run([*self.tmux, "capture-pane", "-p", "-S", "-1000"], capture_output=True, text=True)
        return res.stdout

    def wait_for(self, predicate, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if predicate(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; the terminal shows:\n{text}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)
