"""Speculative decoding: proposers draft tokens for decode rows (proposer.py, ngram.py,
draft_model.py), the target verifies them in the same step (rejection.py), the speculator
decides who speculates and how far (speculator.py)."""
