"""The frontend: requests in (tokenized, checked), outputs out (detokenized, stopped), and the client that reaches the engine core."""
