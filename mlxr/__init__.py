"""MLXR: a local-first LLM inference engine and server."""
from mlxr.types import CompletionOutput, ImagePrompt, Logprob, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "ImagePrompt"]


def _installed_version() -> str:
    """pyproject's version, as installed (the one source of truth; /api/version reports it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlxr")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0.0.0+unknown"


__version__ = _installed_version()


def __getattr__(name: str):
    # LLM pulls in torch and the loaders; import it lazily so `import mlxr` stays light.
    if name == "LLM":
        from mlxr.llm import LLM

        return LLM
    raise AttributeError(name)
