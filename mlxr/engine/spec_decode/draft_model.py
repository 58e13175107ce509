"""A draft model proposer: any loaded model with the target's vocabulary drafts k tokens per row
by k batched forwards of its own. Its KV cache lives beside the target's, in blocks of its own;
per request it remembers which tokens that cache holds, so after a verification it keeps the
agreed prefix and recomputes from the first token that differs (rollback by counts)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mlxr.engine.kv.cache import KVCache
from mlxr.engine.spec_decode.proposer import Draft, DraftRequest, ProposerUnavailable
from mlxr.engine.worker.input_batch import slots_for
from mlxr.engine.worker.metadata import pack_step
from mlxr.engine.worker.sampler import Sampler, SamplingState, make_generator
from mlxr.model_config import ModelArgs
from mlxr.types import SamplingParams


@dataclass
class _DraftSeq:
    tokens: list[int] = field(default_factory=list)  # tokens whose K/V the draft cache holds
    table: list[int] = field(default_factory=list)
    confirmed: int = 0  # tokens[:confirmed] were the request's own (not drafts) when fed
    generator: torch.Generator | None = None


class DraftModelProposer:
    def __init__(self, model: nn.Module, args: ModelArgs, dtype: torch.dtype, device: torch.device,
                 block_size: int, num_blocks: int) -> None:
        self.model, self.device, self.block_size = model, torch.device(device), block_size
        # One block past the free ones: the scratch block of CUDA-graph padding rows.
        self.kv: KVCache | None = KVCache(args, num_blocks + 1, block_size, dtype, self.device, 0)
        self.free = list(range(num_blocks - 1, -1, -1))
        self.seqs: dict[str, _DraftSeq] = {}
        self.graphs = None  # DecodeGraphs of the draft model: its one-token forwards replay them

    def enable_cuda_graphs(self, max_batch: int, max_blocks_per_seq: int) -> None:
        from mlxr.engine.worker.cuda_graphs import DecodeGraphs

        self.graphs = DecodeGraphs(self.model, self.kv, len(self.free), max_batch, max_blocks_per_seq)

    def unload(self) -> None:
        """Drop the draft model and its cache; proposing raises from now on."""
        self.model = self.kv = self.graphs = None
        self.seqs.clear()

    def retain(self, request_ids: set[str]) -> None:
        for rid in [r for r in self.seqs if r not in request_ids]:
            self.free += self.seqs.pop(rid).table

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        if self.model is None:
            raise ProposerUnavailable("the draft model was unloaded")
        drafts: list[list[int]] = [[] for _ in requests]
        probs: list[list[torch.Tensor]] = [[] for _ in requests]
        feeds = {i: self._catch_up(r) for i, r in enumerate(requests) if r.num_drafts > 0}
        feeds = {i: f for i, f in feeds.items() if f is not None}
        while feeds:
            order = list(feeds)
            logits = self._forward([(requests[i].request_id, feeds[i]) for i in order])
            argmax = logits.argmax(-1).tolist()  # one sync for every greedy row
            for row, i in enumerate(order):
                token, q = self._draw(logits[row], argmax[row], requests[i])
                drafts[i].append(token)
                if q is not None:
                    probs[i].append(q)
            # the last draft is never fed: the target computes it
            feeds = {i: [drafts[i][-1]] for i in order if len(drafts[i]) < requests[i].num_drafts}
        return [Draft(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs)]

    def _catch_up(self, r: DraftRequest) -> list[int] | None:
        """The tokens the draft must feed before its first draft (from the first one its cache
        lacks or holds differently), with blocks reserved for them and the drafts; None when
        the draft cache has no room (this row goes without drafts)."""
        seq = self.seqs.get(r.request_id)
        if seq is None:
            seq = self.seqs[r.request_id] = _DraftSeq(generator=self._generator(r))
        end = min(len(seq.tokens), len(r.token_ids) - 1)
        keep = min(seq.confirmed, end)
        while keep < end and seq.tokens[keep] == r.token_ids[keep]:  # past `confirmed`: its drafts
            keep += 1
        del seq.tokens[keep:]
        seq.confirmed = len(r.token_ids)
        need = -(-(len(r.token_ids) + r.num_drafts - 1) // self.block_size) - len(seq.table)
        if need > len(self.free):
            return None
        seq.table += [self.free.pop() for _ in range(max(0, need))]
        return r.token_ids[keep:]

    def _generator(self, r: DraftRequest) -> torch.Generator | None:
        seed = r.params.seed
        return None if seed is None else make_generator((seed + 0x5EED) % (1 << 63), self.device)

    def _forward(self, rows: list[tuple[str, list[int]]]) -> torch.Tensor:
        """Feed each row's tokens after what its cache holds; float32 logits at each row's last.
        Where a decode graph holds every fed token, each is a decode row of its own (over its
        sequence's block table, attending up to its own position: K/V are written before
        attention reads them), so a catch-up of a few tokens replays the graph too."""
        bs = self.block_size
        ids, pos, slots, q_lens, seq_lens, last = [], [], [], [], [], []
        width = max(len(self.seqs[rid].table) for rid, _ in rows)
        split = self.graphs is not None and self.graphs.fits(sum(len(f) for _, f in rows), width)
        tables = []
        for rid, feed in rows:
            seq = self.seqs[rid]
            start, end = len(seq.tokens), len(seq.tokens) + len(feed)
            ids += feed
            pos += range(start, end)
            slots += slots_for(seq.table, start, end, bs)
            table = seq.table + [0] * (width - len(seq.table))
            if split:
                q_lens += [1] * len(feed)
                seq_lens += range(start + 1, end + 1)
                tables += table * len(feed)
            else:
                q_lens.append(len(feed))
                seq_lens.append(end)
                tables += table
            last.append(len(ids) - 1)
            seq.tokens += feed
        step = pack_step(ids, pos, slots, q_lens, seq_lens, tables, width, last, bs, self.device)
        last_t = step.extra
        if self.graphs is not None and self.graphs.can_run(step.meta):
            return self.graphs.run(step.input_ids, step.positions, step.meta).index_select(0, last_t)
        hidden = self.model(step.input_ids, step.positions, self.kv.model_layers, step.meta)
        return self.model.compute_logits(hidden.index_select(0, last_t)).float()

    def _draw(self, logits: torch.Tensor, argmax: int, r: DraftRequest) -> tuple[int, torch.Tensor | None]:
        return draw_draft(logits, argmax, r.params, self.seqs[r.request_id].generator)


def draw_draft(logits: torch.Tensor, argmax: int, params: SamplingParams,
               generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """Greedy rows take the argmax (a certain draft); others sample q, the request's own
    sampling distribution (temperature, top_k/top_p, min_p) over the draft's logits: any q
    keeps verification lossless, and one filtered as the target's p drafts tokens p can
    take (unfiltered, a draft outside p's top_k is always rejected)."""
    if params.greedy:
        return argmax, None
    state = SamplingState(params, [], [], frozenset(), None)
    q = torch.softmax(Sampler.filtered_logits(torch.nan_to_num(logits, nan=-1e30).unsqueeze(0), [state])[0], dim=-1)
    token = torch.multinomial(q, 1, generator=generator)
    return int(token), q
