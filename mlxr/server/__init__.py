"""The HTTP server: OpenAI and Ollama routes, guards, metrics and logs over the engine."""
