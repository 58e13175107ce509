"""Debian's chromium driven by Playwright, for the web UI tests.

Playwright's own browser download needs a host this project cannot reach, so the tests use
the distribution's chromium and install it with apt-get when it is missing (CI runs as root
on a fresh Debian machine). A machine where that fails makes the tests fail, not skip."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CHROMIUM = Path(os.environ.get("MLXR_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def ensure_chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise RuntimeError(f"{CHROMIUM} is missing and cannot be installed here: run `apt-get install -y chromium` as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True, env=env, capture_output=True)
    if not CHROMIUM.exists():
        raise RuntimeError(f"apt-get installed chromium but {CHROMIUM} is not there")
    return CHROMIUM


def launch(playwright):
    return playwright.chromium.launch(executable_path=str(ensure_chromium()), args=CHROMIUM_ARGS)


class ConsoleErrors:
    """Collects console errors and uncaught page errors of one page."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def unexpected(self, allowed: tuple[str, ...] = ()) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in allowed)]
