"""Suffix decoding (after SuffixDecoding, Oliaro et al. 2024, as Arctic Inference ships it): two
depth-bounded suffix trees (suffix_tree.py) propose each row's draft. One per request, over its
prompt and output so far; one shared, over the outputs of recently finished requests (an agent
re-emits its earlier calls and answers; a rewrite repeats what another request wrote). The
draft follows the most frequent continuation of the context's longest match in either tree,
at most alpha x the match's length, and stops where the continuation's empirical probability
falls under min_prob; of the two trees' drafts the one with more expected kept tokens wins.

Bounded (SuffixConfig; its environment switches set the defaults): a request's tree indexes at most the last `window` tokens
of its prompt, and past max_request_nodes it is rebuilt from its latest tokens; the shared tree
keeps at most cache_responses outputs (each cut to its last `window` tokens) and cache_nodes
nodes, evicting the least recently finished. Every update costs O(max_depth) per new token."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from mlxr.config import SuffixConfig
from mlxr.engine.spec_decode.proposer import Draft, DraftRequest
from mlxr.engine.spec_decode.suffix_tree import Cursor, Guess, SuffixTree


@dataclass
class _RequestTree:
    tree: SuffixTree
    tokens: list[int]  # the latest token ids asked about: its output when it finishes
    num_prompt_tokens: int
    cursor: Cursor = field(default_factory=Cursor)
    indexed: int = 0  # tokens[:indexed] were fed (or skipped, before the window)


class SuffixProposer:
    def __init__(self, config: SuffixConfig) -> None:
        self.config = config
        self._requests: dict[str, _RequestTree] = {}
        self.cache = SuffixTree(config.max_depth)
        self._cached: OrderedDict[str, list[int]] = OrderedDict()  # finished outputs, oldest first

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        return [Draft(self.guess(r).token_ids) for r in requests]

    def guess(self, r: DraftRequest) -> Guess:
        c = self.config
        if r.num_drafts <= 0:
            return Guess([], [], 0)
        state = self._index(r)
        context = r.token_ids[-(c.max_depth - 1):]
        best = state.tree.guess(context, r.num_drafts, c.alpha, c.min_prob)
        if self._cached:
            shared = self.cache.guess(context, r.num_drafts, c.alpha, c.min_prob)
            if shared.score > best.score:
                best = shared
        return best

    def retain(self, request_ids: set[str]) -> None:
        for rid in [rid for rid in self._requests if rid not in request_ids]:
            state = self._requests.pop(rid)
            self._remember(rid, state.tokens[state.num_prompt_tokens:])

    def _index(self, r: DraftRequest) -> _RequestTree:
        """The request's tree, extended by the tokens that landed since its last lookup."""
        state = self._requests.get(r.request_id)
        if state is None or len(r.token_ids) < state.indexed:  # new, or not the sequence indexed so far
            state = self._requests[r.request_id] = _RequestTree(SuffixTree(self.config.max_depth), r.token_ids,
                                                                r.num_prompt_tokens)
            state.indexed = max(0, len(r.token_ids) - self.config.window)
        state.tokens = r.token_ids
        state.tree.extend(state.cursor, r.token_ids[state.indexed:])
        state.indexed = len(r.token_ids)
        if state.tree.num_nodes > self.config.max_request_nodes:
            self._rebuild(state)
        return state

    def _rebuild(self, state: _RequestTree) -> None:
        """Start the request's tree over from as many of its latest tokens as fill half its node
        budget (each token adds at most max_depth nodes), so the next rebuild is that far away."""
        keep = max(1, self.config.max_request_nodes // (2 * self.config.max_depth))
        state.tree, state.cursor = SuffixTree(self.config.max_depth), Cursor()
        state.tree.extend(state.cursor, state.tokens[max(0, state.indexed - keep):state.indexed])

    def _remember(self, request_id: str, output: list[int]) -> None:
        """Put a finished request's output in the shared tree, evicting the oldest past the bounds."""
        c = self.config
        if c.cache_responses <= 0 or not output:
            return
        old = self._cached.pop(request_id, None)  # (a preempted request comes back under its id)
        if old is not None:
            self.cache.remove(old)
        output = list(output[-c.window:])
        self.cache.extend(Cursor(), output)
        self._cached[request_id] = output
        while self._cached and (len(self._cached) > c.cache_responses or self.cache.num_nodes > c.cache_nodes):
            self.cache.remove(self._cached.popitem(last=False)[1])
