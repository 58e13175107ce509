"""Who speculates, how far, and what it earned. Owned by the engine core.

Before a step is scheduled the speculator asks its proposer for drafts for the decode rows
whose tokens are all on the host, and puts them on the requests (Request.spec_token_ids); the
scheduler places them in the rows, the runner verifies them, and `observe` counts the result.
Overlap: a proposer needs each row's last token on the host, so a step that speculates lands
the step before it first (and a step that carried drafts is landed before the next one is
scheduled); steps with no row to speculate on keep overlapping the host with the device.
Speculation turns itself off when more than max_batch requests run (the step is then no
longer bound by reading the weights, and verifying drafts costs real compute), per request on
opt-out (SamplingParams.speculative=False), and for good for a request whose proposer failed.
A structured-output row whose grammar forces more tokens next than its proposer drafted drafts
those instead (llguidance's fast-forward tokens, as jump-forward decoding uses them): under
the row's masks they pass verification unless the model writes the same text in other tokens.
A request whose proposer found nothing rests for as many steps as it has come back empty in a
row (at most MAX_REST): at batch 1 a step that lands first only to draft nothing loses the
overlap of host and device (SmolLM2 on an H100: 2.48 ms a step against 2.0), and lookups miss
in runs (while the output departs from the input)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from mlxr.engine.records import ModelRunnerOutput, SchedulerOutput
from mlxr.engine.request import Request
from mlxr.engine.spec_decode.proposer import DraftRequest, Proposer

log = logging.getLogger(__name__)

# Steps a request skips drafting after empty proposals in a row. 1: at batch 1 on an H100
# (SmolLM2, k = 8, four rewrite/edit tasks, interleaved in one process) 3 gave 1.95x, 1 2.08x
# and 0 2.08x (bench/probes/spec_rest_ab.py); one step of rest still bounds the landings a long
# run of misses costs, while the text rewrites rejoin their input within a token or two.
MAX_REST = 1


@dataclass
class SpecStats:
    num_drafts: int = 0  # rows that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # drafts kept at position j
    drafted_per_position: list[int] = field(default_factory=list)  # drafts offered at position j


class Speculator:
    def __init__(self, proposer: Proposer, max_drafts: int, max_batch: int) -> None:
        self.proposer, self.max_drafts, self.max_batch = proposer, max_drafts, max_batch
        self.stats = SpecStats(0, 0, 0, [0] * max_drafts, [0] * max_drafts)
        self.draft_probs: dict[str, torch.Tensor] = {}  # this step's draft distributions, by request
        self._k: dict[str, int] = {}  # each request's current draft length (adapts to acceptance)
        self._off: set[str] = set()  # requests whose proposer failed
        self._misses: dict[str, int] = {}  # empty proposals in a row, by request
        self._rest: dict[str, int] = {}  # steps left before a request drafts again

    def reset(self) -> None:
        self._k.clear()
        self._off.clear()
        self._misses.clear()
        self._rest.clear()
        self.draft_probs = {}
        self.proposer.retain(set())

    def _speculates(self, req: Request) -> bool:
        return (req.params.speculative and req.request_id not in self._off
                and req.num_computed_tokens == req.num_tokens - 1 and not req.has_all_outputs)

    def needs_landed_tokens(self, running: list[Request], inflight: SchedulerOutput | None, waiting: int = 0) -> bool:
        """Whether the step in flight must land before this one is scheduled."""
        if inflight is None:
            return False
        if inflight.spec_token_ids:
            return True
        return len(running) + waiting <= self.max_batch and any(
            self._speculates(r) and not self._rest.get(r.request_id) for r in running)

    def propose(self, running: list[Request], waiting: int = 0) -> None:
        """Drafts for this step's decode rows (on req.spec_token_ids; none for the others).
        waiting: requests queued for admission; they count towards max_batch, so a batch
        that is still filling up is not slowed by steps that land before the next starts."""
        self.draft_probs = {}
        for req in running:
            req.spec_token_ids = []
        live = {r.request_id for r in running}
        self._k = {rid: k for rid, k in self._k.items() if rid in live}
        self.proposer.retain(live)
        if len(running) + waiting > self.max_batch:
            return
        self._count_down_rests(live)
        rows = [(r, self._num_drafts(r)) for r in running
                if r.num_in_flight == 0 and self._speculates(r) and r.request_id not in self._rest]
        rows = [(r, k) for r, k in rows if k > 0]
        if not rows:
            return
        try:
            drafts = self.proposer.propose([DraftRequest(r.request_id, r.token_ids, k, r.params) for r, k in rows])
        except Exception as e:  # noqa: BLE001 - a failed proposer costs speculation, never the request
            log.warning("speculation off for %d request(s): the proposer failed: %s: %s",
                        len(rows), type(e).__name__, e)
            self._off |= {r.request_id for r, _ in rows}
            self.proposer.retain(live - self._off)
            return
        for (req, k), draft in zip(rows, drafts):
            tokens, probs = draft.token_ids[:k], draft.probs
            # llguidance's fast-forward only where it could draft more than the proposer did
            forced = req.grammar.forced_tokens()[:k] if req.grammar is not None and len(tokens) < k else []
            if len(forced) > len(tokens):  # the grammar's fixed text outruns the proposer's guess
                tokens, probs = forced, None
            req.spec_token_ids = tokens
            self._note_lookup(req.request_id, bool(tokens))
            if probs is not None and tokens:
                self.draft_probs[req.request_id] = probs

    def _count_down_rests(self, live: set[str]) -> None:
        self._misses = {rid: m for rid, m in self._misses.items() if rid in live}
        self._rest = {rid: n - 1 for rid, n in self._rest.items() if rid in live and n > 1}

    def _note_lookup(self, request_id: str, found: bool) -> None:
        if found:
            self._misses.pop(request_id, None)
            return
        misses = self._misses[request_id] = self._misses.get(request_id, 0) + 1
        self._rest[request_id] = min(misses, MAX_REST)

    def _num_drafts(self, req: Request) -> int:
        room = req.max_output_tokens - req.num_output_tokens - 1
        return min(self._k.get(req.request_id, self.max_drafts), room)

    def observe(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Count a landed step's verified drafts and adapt each row's draft length: one more
        after a fully kept draft, else one past what was kept."""
        stats = self.stats
        for rid, sampled in zip(result.request_ids, result.sampled_token_ids):
            drafts = out.spec_token_ids.get(rid)
            if not drafts:
                continue
            accepted = len(sampled) - 1
            stats.num_drafts += 1
            stats.num_draft_tokens += len(drafts)
            stats.num_accepted_tokens += accepted
            for j in range(len(drafts)):
                stats.drafted_per_position[j] += 1
                stats.accepted_per_position[j] += j < accepted
            full = accepted == len(drafts)
            self._k[rid] = min(self.max_drafts, len(drafts) + 1 if full else accepted + 1)
