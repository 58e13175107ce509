"""The Ollama-compatible API (NDJSON streaming, `{"error": msg}` errors)."""
from mlxr.server.ollama.routes import router

__all__ = ["router"]
