"""A depth-bounded suffix tree (a trie of every suffix, each cut at max_depth tokens) over one or
more token sequences, with an occurrence count per node: the count of a node is how often the
path to it occurs in the indexed text, so a child's count over its siblings' total is the
empirical probability of that continuation. Appending a token costs O(max_depth): the sequence's
cursor holds the node of each of its last max_depth - 1 suffixes, and each steps down one token.
Sequences can be removed again (the cross-request cache's LRU), which prunes nodes whose count
falls to zero.

Nodes are ints into parallel lists (no object per node) and a leaf holds no dict, so a node costs
a few list slots; callers bound the node count (SuffixProposer rebuilds or evicts past it)."""
from __future__ import annotations

from dataclasses import dataclass, field

ROOT = 0


@dataclass
class Cursor:
    """Where one sequence's insertion stands: active[j] is the node of its suffix of j + 1 tokens."""

    active: list[int] = field(default_factory=list)


@dataclass
class Guess:
    """A speculation: the tokens, the product of their continuation probabilities after each,
    the length of the context suffix it continues, and its score (the expected number of them
    that a target sampling this text would keep: the sum of those products)."""

    token_ids: list[int]
    probs: list[float]
    match_len: int

    @property
    def score(self) -> float:
        return sum(self.probs)


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        assert max_depth >= 2
        self.max_depth = max_depth
        self.children: list[dict[int, int] | None] = [None]
        self.counts: list[int] = [0]
        self.parent: list[int] = [-1]
        self.token: list[int] = [-1]
        self._free: list[int] = []

    @property
    def num_nodes(self) -> int:
        return len(self.counts) - len(self._free)

    def extend(self, cursor: Cursor, tokens: list[int]) -> None:
        """Append tokens to the sequence whose insertion cursor is `cursor`."""
        limit = self.max_depth - 1
        active = cursor.active
        for t in tokens:
            stepped = [self._child(ROOT, t)]
            stepped += [self._child(node, t) for node in active]
            active = stepped[:limit]
        cursor.active = active

    def remove(self, tokens: list[int]) -> None:
        """Undo extend(Cursor(), tokens) (the same tokens, from an empty cursor)."""
        limit = self.max_depth - 1
        active: list[int] = []
        emptied: list[int] = []
        for t in tokens:
            stepped = []
            for node in [ROOT] + active:
                child = self.children[node][t]
                self.counts[child] -= 1
                if self.counts[child] == 0:
                    emptied.append(child)
                stepped.append(child)
            active = stepped[:limit]
        gone = set(emptied)
        for node in emptied:  # a node whose parent goes too leaves with the parent's dict
            if self.parent[node] not in gone:
                del self.children[self.parent[node]][self.token[node]]
        for node in emptied:
            self.children[node], self.parent[node] = None, -1
        self._free += emptied

    def match(self, context: list[int], longest: int) -> tuple[int, int]:
        """The node of the longest suffix of context (at most `longest` tokens) that the tree
        holds with a continuation, and its length; (ROOT, 0) when none does."""
        for length in range(min(len(context), longest), 0, -1):
            node = self._walk(context, len(context) - length)
            if node is not None and self.children[node]:
                return node, length
        return ROOT, 0

    def guess(self, context: list[int], max_tokens: int, alpha: float, min_prob: float) -> Guess:
        """Follow the most frequent continuation of the context's longest match, up to
        min(max_tokens, alpha * match length) tokens, while its probability stays >= min_prob.
        The match leaves max_tokens of the tree's depth for the continuation."""
        node, match_len = self.match(context, max(1, self.max_depth - 1 - max_tokens))
        budget = min(max_tokens, int(alpha * match_len))
        tokens: list[int] = []
        probs: list[float] = []
        prob = 1.0
        while len(tokens) < budget:
            kids = self.children[node]
            if not kids:
                break
            best = max(kids.values(), key=self.counts.__getitem__)
            prob *= self.counts[best] / sum(self.counts[c] for c in kids.values())
            if prob < min_prob:
                break
            tokens.append(self.token[best])
            probs.append(prob)
            node = best
        return Guess(tokens, probs, match_len)

    def _walk(self, context: list[int], start: int) -> int | None:
        node = ROOT
        for i in range(start, len(context)):
            kids = self.children[node]
            node = kids.get(context[i]) if kids else None
            if node is None:
                return None
        return node

    def _child(self, node: int, token: int) -> int:
        kids = self.children[node]
        if kids is None:
            kids = self.children[node] = {}
        child = kids.get(token)
        if child is None:
            child = kids[token] = self._new(node, token)
        self.counts[child] += 1
        return child

    def _new(self, parent: int, token: int) -> int:
        if self._free:
            node = self._free.pop()
            self.children[node], self.counts[node], self.parent[node], self.token[node] = None, 0, parent, token
            return node
        self.children.append(None)
        self.counts.append(0)
        self.parent.append(parent)
        self.token.append(token)
        return len(self.counts) - 1
