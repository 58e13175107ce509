"""A proposer that drafts with a model head (an EAGLE-3 head, a model's MTP layer) from the
target's own hidden states.

The runner hands it every step's hidden states (take_hidden). Per request it keeps the target
features of the positions its head has not yet taken in, and a one-layer KV cache of its own
in blocks of its own. Head position i takes token i + 1 with the target's features of token i
(so features through the last computed token draft the first token past the sequence); each
further draft takes the head's own output in the features' place. Rollback is by counts: a
step's catch-up rewrites the head's cache from the first position not yet confirmed, so the
entries of drafts (and of drafts the target rejected) are overwritten, never read. Positions
whose features never came (a prefix served from the cache, an image step) start the head's
cache afresh after them: its attention then sees only what followed (drafts worsen; what the
target emits does not change)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mlxr.engine.kv.cache import KVCache
from mlxr.engine.spec_decode.draft_model import draw_draft
from mlxr.engine.spec_decode.proposer import Draft, DraftRequest, StepHidden
from mlxr.engine.worker.input_batch import slots_for
from mlxr.engine.worker.metadata import pack_step
from mlxr.engine.worker.sampler import make_generator

# Target features a request may hold before its head takes them in: a request that goes on
# without drafts (a batch past speculative_max_batch) keeps only its latest ones; its head's
# cache starts over there.
MAX_PENDING_FEATURES = 1024


@dataclass
class _HeadSeq:
    base: int  # the position of the head cache's first entry
    at: int  # the first position whose head entry is to be (re)computed; feats start there
    feats: torch.Tensor | None = None  # the target's features of positions at, at + 1, ...
    table: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


@dataclass
class _Feed:
    seq: _HeadSeq
    token_ids: list[int]
    start: int  # position of the first token
    hidden: torch.Tensor  # [len(token_ids), head hidden]


class HeadProposer:
    def __init__(self, head, dtype: torch.dtype, device: torch.device, block_size: int, num_blocks: int) -> None:
        """head: an Eagle3Head or MTPHead (features, project, forward, logits, kv_args, aux_layers)."""
        self.head, self.device, self.block_size = head, torch.device(device), block_size
        self.aux_layers: tuple[int, ...] = tuple(head.aux_layers)
        self.kv = KVCache(head.kv_args, num_blocks, block_size, dtype, self.device, 0)
        self.free = list(range(num_blocks - 1, -1, -1))
        self.seqs: dict[str, _HeadSeq] = {}

    def retain(self, request_ids: set[str]) -> None:
        for rid in [r for r in self.seqs if r not in request_ids]:
            self.free += self.seqs.pop(rid).table

    def take_hidden(self, step: StepHidden) -> None:
        feats = self.head.features(step.final, step.aux)
        offset = 0
        for rid, start, n in zip(step.request_ids, step.starts, step.counts):
            self._merge(rid, start, feats[offset: offset + n])
            offset += n

    def _merge(self, rid: str, start: int, f: torch.Tensor) -> None:
        seq = self.seqs.get(rid)
        if seq is None:
            seq = self.seqs[rid] = _HeadSeq(start, start)
        if start < seq.at:  # positions the head holds already (a recomputed prefix)
            f, start = f[seq.at - start:], seq.at
            if not len(f):
                return
        end = seq.at + (0 if seq.feats is None else len(seq.feats))
        if start > end:  # no features for the positions between: the head's cache starts over
            seq.base = seq.at = start
        elif start > seq.at:
            f = torch.cat([seq.feats[: start - seq.at], f])
        if len(f) > MAX_PENDING_FEATURES:
            cut = len(f) - MAX_PENDING_FEATURES
            f, seq.base, seq.at = f[cut:], seq.at + cut, seq.at + cut
        seq.feats = f

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        feeds = {i: self._catch_up(r) for i, r in enumerate(requests) if r.num_drafts > 0}
        feeds = {i: f for i, f in feeds.items() if f is not None}
        while feeds:
            order = list(feeds)
            normed, chain = self._forward([feeds[i] for i in order])
            logits = self.head.logits(normed)
            argmax = logits.argmax(-1).tolist()  # one sync for every greedy row
            for row, i in enumerate(order):
                token, q = draw_draft(logits[row], argmax[row], requests[i].params, feeds[i].seq.generator)
                drafts[i].append(token)
                if q is not None:
                    probs[i].append(q)
            # the last draft is never fed: the target computes it
            feeds = {i: _Feed(feeds[i].seq, [drafts[i][-1]], feeds[i].start + len(feeds[i].token_ids),
                              chain[row: row + 1])
                     for row, i in enumerate(order) if len(drafts[i]) < requests[i].num_drafts}
        return [Draft(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs)]

    def _catch_up(self, r: DraftRequest) -> _Feed | None:
        """The confirmed positions the head takes in before its first draft (through the one
        before the last token), with blocks reserved for them and the drafts; None when the
        target's features of those positions are not all in, or the head's cache is full."""
        seq, n_tokens = self.seqs.get(r.request_id), len(r.token_ids)
        if seq is None or seq.feats is None:
            return None
        last = n_tokens - 2  # the last position the target has computed
        have = seq.at + len(seq.feats) - 1
        if have > last:  # positions of rejected drafts (the tokens there are others now)
            seq.feats = seq.feats[: last + 1 - seq.at]
        if have < last or seq.at > last:
            return None
        need = -(-(n_tokens + r.num_drafts - 1 - seq.base) // self.block_size) - len(seq.table)
        if need > len(self.free):
            return None
        seq.table += [self.free.pop() for _ in range(max(0, need))]
        if seq.generator is None and r.params.seed is not None:
            seq.generator = make_generator((r.params.seed + 0x4EAD) % (1 << 63), self.device)
        start, hidden = seq.at, self.head.project(seq.feats)
        # The last confirmed position stays to be fed again: the next catch-up starts from its
        # output, whether or not new features came in between.
        seq.at, seq.feats = last, seq.feats[-1:]
        return _Feed(seq, r.token_ids[start + 1: n_tokens], start, hidden)

    def _forward(self, feeds: list[_Feed]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each feed's tokens into the head's cache; (normed, chained) rows at each feed's last."""
        bs = self.block_size
        ids, pos, slots, q_lens, seq_lens, tables, last = [], [], [], [], [], [], []
        width = max(len(f.seq.table) for f in feeds)
        for f in feeds:
            n, local = len(f.token_ids), f.start - f.seq.base
            ids += f.token_ids
            pos += range(f.start, f.start + n)
            slots += slots_for(f.seq.table, local, local + n, bs)
            q_lens.append(n)
            seq_lens.append(local + n)
            tables += f.seq.table + [0] * (width - len(f.seq.table))
            last.append(len(ids) - 1)
        step = pack_step(ids, pos, slots, q_lens, seq_lens, tables, width, last, bs, self.device)
        hidden = torch.cat([f.hidden for f in feeds]) if len(feeds) > 1 else feeds[0].hidden
        normed, chain = self.head(step.input_ids, hidden, step.positions, self.kv.layers[0], step.meta)
        return normed.index_select(0, step.extra), chain.index_select(0, step.extra)
