"""Prompt lookup: the last few tokens of a sequence are looked up earlier in the same sequence
(prompt and output so far); the tokens that followed the most recent match are the draft.
No model: it pays on input-grounded work (edits, rewrites, extraction, code), where the output
repeats spans of the input. Work per request is bounded by the search window."""
from __future__ import annotations

import numpy as np

from mlxr.engine.spec_decode.proposer import Draft, DraftRequest


class NgramProposer:
    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, window: int = 2048) -> None:
        assert 1 <= min_ngram <= max_ngram and window > max_ngram
        self.max_ngram, self.min_ngram, self.window = max_ngram, min_ngram, window

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        return [Draft(self.lookup(r.token_ids, r.num_drafts)) for r in requests]

    def retain(self, request_ids: set[str]) -> None:
        pass  # keeps nothing per request

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix
        (max_ngram down to min_ngram tokens) within the last `window` tokens."""
        if k <= 0 or len(token_ids) <= self.min_ngram:
            return []
        seq = np.asarray(token_ids[-self.window:], dtype=np.int64)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            start = self._latest_match(seq, n)
            if start is not None:
                return seq[start + n: start + n + k].tolist()
        return []

    @staticmethod
    def _latest_match(seq: np.ndarray, n: int) -> int | None:
        """Start of the latest n-gram equal to seq's last n tokens, the suffix itself excluded."""
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        return int(hits[-1]) if hits.size else None
