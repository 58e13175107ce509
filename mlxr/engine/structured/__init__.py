"""Structured output: a request's constraint (types.StructuredOutputsParams) as a grammar,
compiled once per content hash, a matcher per request that the landed tokens advance, and the
packed token bitmask that the sampler applies. The grammar engine is llguidance."""
