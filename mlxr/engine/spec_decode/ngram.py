"""Prompt lookup: the last few tokens of a sequence are looked up earlier in the same sequence
(prompt and output so far); the tokens that followed the most recent match are the draft.
No model: it pays on input-grounded work (edits, rewrites, extraction, code), where the output
repeats spans of the input. Work per request is bounded by the search window.

Each request keeps an index of its n-grams' latest starts, extended by the tokens that landed
since its last lookup: a lookup is a few dictionary reads, not a scan of the window (at batch 1
this work sits between a step landing and the next one launching)."""
from __future__ import annotations

from mlxr.engine.spec_decode.proposer import Draft, DraftRequest


class NgramIndex:
    """The latest start of every n-gram (n in ns) of one growing token sequence."""

    def __init__(self, ns: range) -> None:
        self.ns = ns
        self._clear()

    def _clear(self) -> None:
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ns}
        self.indexed: dict[int, int] = dict.fromkeys(self.ns, 0)  # starts below this are in latest[n]
        self.length = 0

    def match(self, token_ids: list[int], n: int, first: int) -> int | None:
        """Start of the latest n-gram equal to the last n tokens, the suffix itself excluded,
        at `first` or later (earlier starts are never asked for again, so never indexed)."""
        if len(token_ids) < self.length:  # not the sequence indexed so far: start over
            self._clear()
        self.length = len(token_ids)
        table, end = self.latest[n], len(token_ids) - n  # starts s < end leave a token after the n-gram
        for s in range(max(self.indexed[n], first), end):
            table[tuple(token_ids[s:s + n])] = s
        self.indexed[n] = max(self.indexed[n], end)
        s = table.get(tuple(token_ids[-n:]))
        return s if s is not None and s >= first else None


class NgramProposer:
    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, window: int = 2048) -> None:
        assert 1 <= min_ngram <= max_ngram and window > max_ngram
        self.max_ngram, self.min_ngram, self.window = max_ngram, min_ngram, window
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        return [Draft(self.lookup(r.token_ids, r.num_drafts, self._index(r.request_id))) for r in requests]

    def retain(self, request_ids: set[str]) -> None:
        for rid in [rid for rid in self._indexes if rid not in request_ids]:
            del self._indexes[rid]

    def _index(self, request_id: str) -> NgramIndex:
        index = self._indexes.get(request_id)
        if index is None:
            index = self._indexes[request_id] = NgramIndex(range(self.min_ngram, self.max_ngram + 1))
        return index

    def lookup(self, token_ids: list[int], k: int, index: NgramIndex | None = None) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix
        (max_ngram down to min_ngram tokens) within the last `window` tokens."""
        if k <= 0 or len(token_ids) <= self.min_ngram:
            return []
        index = index or NgramIndex(range(self.min_ngram, self.max_ngram + 1))
        first = max(0, len(token_ids) - self.window)
        for n in range(min(self.max_ngram, len(token_ids) - first - 1), self.min_ngram - 1, -1):
            start = index.match(token_ids, n, first)
            if start is not None:
                return token_ids[start + n: start + n + k]
        return []
