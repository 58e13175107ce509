"""Tools some tests drive (a terminal multiplexer, a cross compiler and an emulator): installed
from Debian's packages with apt-get when missing (CI runs as root on Debian); a test skips only
when that fails."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def ensure_commands(commands: list[str], packages: list[str]) -> list[str]:
    """The commands' paths, after `apt-get install packages` if any is missing; skips the test
    when one is still missing."""
    if not all(shutil.which(c) for c in commands) and shutil.which("apt-get") and os.geteuid() == 0:
        install = ["apt-get", "install", "-y", "-q", *packages]
        if subprocess.run(install, capture_output=True, timeout=600).returncode:
            # a fresh container has no package lists yet (webui_browser.py updates them too)
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600)
            subprocess.run(install, capture_output=True, timeout=600)
    missing = [c for c in commands if not shutil.which(c)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed and `apt-get install {' '.join(packages)}` failed "
                    "(not root or no apt): install them to run these tests")
    return [shutil.which(c) for c in commands]
