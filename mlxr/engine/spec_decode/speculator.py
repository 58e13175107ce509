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
That is jump-forward (on by default, with or without a proposer, within max_batch requests
like all speculation; factory.py says why not past it).
A request whose proposer found nothing rests for as many steps as it has come back empty in a
row (at most MAX_REST): at batch 1 a step that lands first only to draft nothing loses the
overlap of host and device (SmolLM2 on an H100: 2.48 ms a step against 2.0), and lookups miss
in runs (while the output departs from the input)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from mlxr.engine.records import ModelRunnerOutput, SchedulerOutput
from mlxr.engine.sched.request import Request
from mlxr.engine.spec_decode.batch_policy import DraftBudget
from mlxr.engine.spec_decode.proposer import Draft, DraftRequest, Proposer

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
    # Of the above, jump-forward's: rows whose drafts were their grammar's forced tokens.
    forced_drafts: int = 0
    forced_draft_tokens: int = 0
    forced_accepted_tokens: int = 0


class Speculator:
    def __init__(self, proposer: Proposer | None, max_drafts: int, max_batch: int, jump_forward: bool = False,
                 max_rows: int | None = None, budget: DraftBudget | None = None) -> None:
        """proposer: None drafts only what grammars force (jump_forward). jump_forward: a
        structured-output row drafts its grammar's forced tokens (within max_batch requests;
        factory.py says why). max_rows: a step's rows, drafts included, at most (the largest
        CUDA graph; None: no bound here). budget: the proposer's drafts per row and step come
        from the device's measured step costs and each request's acceptance, at any batch
        (batch_policy.py); None: up to max_drafts while at most max_batch requests run."""
        self.proposer, self.max_drafts, self.max_batch = proposer, max_drafts, max_batch
        self.jump_forward, self.max_rows, self.budget = jump_forward, max_rows, budget
        self.stats = SpecStats(0, 0, 0, [0] * max_drafts, [0] * max_drafts)
        self.draft_probs: dict[str, torch.Tensor] = {}  # this step's draft distributions, by request
        self._k: dict[str, int] = {}  # each request's current draft length (adapts to acceptance)
        self._off: set[str] = set()  # requests whose proposer failed
        self._misses: dict[str, int] = {}  # empty proposals in a row, by request
        self._rest: dict[str, int] = {}  # steps left before a request drafts again
        self._drafted = False  # whether the last proposal put drafts on any row
        self._forced: set[str] = set()  # rows whose drafts this step are their grammar's forced tokens

    def reset(self) -> None:
        self._k.clear()
        self._off.clear()
        self._misses.clear()
        self._rest.clear()
        self._forced.clear()
        self.draft_probs, self._drafted = {}, False
        if self.proposer is not None:
            self.proposer.retain(set())
        if self.budget is not None:
            self.budget.retain(set())

    def _speculates(self, req: Request) -> bool:
        return req.params.speculative and req.num_computed_tokens == req.num_tokens - 1 and not req.has_all_outputs

    def _looks_up(self, req: Request) -> bool:
        """Whether the proposer drafts for req this step (given the batch is small enough). A
        request whose proposer failed keeps jump-forward: its grammar's forced tokens need none."""
        rid = req.request_id
        return self.proposer is not None and rid not in self._off and not self._rest.get(rid)

    def _jumps(self, req: Request) -> bool:
        """Whether req's grammar may force tokens to draft."""
        return self.jump_forward and req.grammar is not None and not req.grammar.done

    def needs_landed_tokens(self, running: list[Request], inflight: SchedulerOutput | None, waiting: int = 0) -> bool:
        """Whether the step in flight must land before this one is scheduled."""
        if inflight is None:
            return False
        if inflight.spec_token_ids:
            return True
        if self.max_rows is not None and len(running) >= self.max_rows:
            return False  # no row left for a draft: landing first would only lose the overlap
        if not self.may_draft(len(running) + waiting):
            return False
        small = len(running) + waiting <= self.max_batch
        if any(small and self._jumps(r) and self._speculates(r) for r in running):
            return True
        lookups = [(r, self._num_drafts(r)) for r in running if self._looks_up(r) and self._speculates(r)]
        if self.budget is None or not lookups:
            return small and bool(lookups)
        return any(self._planned(lookups, len(running) + waiting, count=False))

    def may_draft(self, batch: int) -> bool:
        """Whether any row may draft while batch requests run (running and waiting)."""
        if self.budget is not None and self.proposer is not None:
            return True
        return (self.proposer is not None or self.jump_forward) and batch <= self.max_batch

    def _planned(self, lookups: list[tuple[Request, int]], batch: int, count: bool = True) -> list[int]:
        """The budget's drafts for each lookup row in a step of batch requests (count: the
        step's own plan, not needs_landed_tokens' look ahead)."""
        room = float("inf") if self.max_rows is None else self.max_rows - batch
        return self.budget.plan(batch, [(r.request_id, k) for r, k in lookups], room, count)

    def propose(self, running: list[Request], waiting: int = 0) -> None:
        """Drafts for this step's decode rows (on req.spec_token_ids; none for the others).
        waiting: requests queued for admission; they count towards max_batch, so a batch
        that is still filling up is not slowed by steps that land before the next starts."""
        self.draft_probs = {}
        small = len(running) + waiting <= self.max_batch
        if self.proposer is None and not self._drafted and not (small and self.jump_forward):
            return  # nothing drafted last step, nothing to draft now: no row to clear
        self._drafted, self._forced = False, set()
        for req in running:
            req.spec_token_ids = []
        live = {r.request_id for r in running}
        self._k = {rid: k for rid, k in self._k.items() if rid in live}
        if self.proposer is not None:
            self.proposer.retain(live)
        if self.budget is not None:
            self.budget.retain(live)
        if not small and self.budget is None:
            return
        self._count_down_rests(live)
        lookups, jumps = [], []
        for r in running:
            looks, jumps_forward = self._looks_up(r), small and self._jumps(r)
            if not (looks or jumps_forward) or r.num_in_flight or not self._speculates(r):
                continue
            k = self._num_drafts(r)
            if k > 0:
                (lookups if looks else jumps).append((r, k))
        if self.budget is not None and lookups:
            planned = self._planned(lookups, len(running) + waiting)
            jumps += [(r, k) for (r, k), n in zip(lookups, planned) if n == 0 and small and self._jumps(r)]
            lookups = [(r, n) for (r, _), n in zip(lookups, planned) if n > 0]
        elif not small:
            lookups = []
        if not lookups and not jumps:
            return
        room = float("inf") if self.max_rows is None else self.max_rows - len(running)
        for (req, k), draft in zip(lookups, self._lookup(lookups, live)):
            room -= self._place(req, k, draft, room, self._jumps(req))
        for req, k in jumps:
            room -= self._place(req, k, None, room, True)

    def _lookup(self, rows: list[tuple[Request, int]], live: set[str]) -> list[Draft | None]:
        """The proposer's drafts for rows (None for each when it failed: speculation goes off
        for them from the next step)."""
        if not rows:
            return []
        try:
            return self.proposer.propose([DraftRequest(r.request_id, r.token_ids, k, r.params, r.num_prompt_tokens) for r, k in rows])
        except Exception as e:  # noqa: BLE001 - a failed proposer costs speculation, never the request
            log.warning("speculation off for %d request(s): the proposer failed: %s: %s",
                        len(rows), type(e).__name__, e)
            self._off |= {r.request_id for r, _ in rows}
            self.proposer.retain(live - self._off)
            return [None] * len(rows)

    def _place(self, req: Request, k: int, draft: Draft | None, room: float, jump: bool) -> int:
        """Put a row's drafts on it, at most room of them, and return how many: the proposer's
        draft (None: it was not asked, or failed), or, if jump, the grammar's forced tokens
        where they are longer (llguidance's fast-forward only where it could draft more than
        the proposer did)."""
        tokens, probs = (draft.token_ids[:k], draft.probs) if draft is not None else ([], None)
        if jump and len(tokens) < k:
            forced = req.grammar.forced_tokens()[:k]
            if len(forced) > len(tokens):  # the grammar's fixed text outruns the proposer's guess
                tokens, probs = forced, None
                self._forced.add(req.request_id)
        if draft is not None:  # (before the row budget trims it: a trimmed draft was no miss)
            self._note_lookup(req.request_id, bool(tokens))
        if len(tokens) > room:
            tokens = tokens[: max(0, int(room))]
            probs = None if probs is None else probs[: len(tokens)]
        req.spec_token_ids = tokens
        self._drafted |= bool(tokens)
        if probs is not None and tokens:
            self.draft_probs[req.request_id] = probs
        return len(tokens)

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
        after a fully kept draft (never fewer after a kept forced run), else one past what was kept."""
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
            forced = rid in self._forced
            if self.budget is not None and not forced:
                self.budget.observe(rid, len(drafts), accepted)
            if forced:
                stats.forced_drafts += 1
                stats.forced_draft_tokens += len(drafts)
                stats.forced_accepted_tokens += accepted
            full = accepted == len(drafts)
            if full and forced:  # a forced run's length is the grammar's: no reason to draft less
                self._k[rid] = min(self.max_drafts, max(self._k.get(rid, self.max_drafts), len(drafts) + 1))
            else:
                self._k[rid] = min(self.max_drafts, len(drafts) + 1 if full else accepted + 1)
