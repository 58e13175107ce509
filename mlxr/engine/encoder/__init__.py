"""The encoder engine: embedding and reranking models, whole inputs per forward (no KV cache,
no steps), batched under a token bound."""
