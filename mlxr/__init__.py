"""MLXR: a local-first LLM inference engine and server."""
from mlxr.types import CompletionOutput, Logprob, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM pulls in torch and the loaders; import it lazily so `import mlxr` stays light.
    if name == "LLM":
        from mlxr.llm import LLM

        return LLM
    raise AttributeError(name)
