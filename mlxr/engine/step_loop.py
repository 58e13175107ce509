"""The engine's step: launch a step on the device, take the previous one's tokens in
(record, detokenize, stop, emit), fail what a fault touched.

On CUDA a step is launched, then the previous step's tokens are taken in while the GPU runs
it: the new step reads each sequence's still-unknown token (a placeholder on the host) from
the previous step's sampled tokens on the device. A sequence that turns out to have
finished had one extra row computed, whose result is dropped. Only n > 1 requests, whose
forks are made on the host, make the engine take the previous step in first."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from mlxr.engine.model_runner import PendingTokens
from mlxr.engine.request_state import RequestState, SeqState, build_output, token_logprobs
from mlxr.engine.sampler import LastTokens, SampledToken, SampleFuture, Samples
from mlxr.engine.scheduler import SchedulerOutput
from mlxr.engine.sequence import PLACEHOLDER, Sequence
from mlxr.engine.staging import to_device
from mlxr.types import RequestOutput

log = logging.getLogger(__name__)


@dataclass
class _Launched:
    """A step queued on the device whose sampled tokens the host has not taken in yet."""

    out: SchedulerOutput
    touched: dict[str, RequestState]  # the requests scheduled in the step (an id may be reused later)
    seqs: list[Sequence]  # the sampled sequences, in row order
    future: SampleFuture | None
    rows: dict[int, int]  # seq_id -> row of future.tokens


class StepLoop:
    """LLMEngine's stepping half: uses its scheduler, runner, sampler, block_manager,
    tokenizer, requests, seq_states, _forking, overlap flag, counters and _new_seq."""

    _inflight: _Launched | None = None
    _forking: set[RequestState]  # live requests with n > 1

    def step(self) -> list[RequestOutput]:
        if self._inflight is not None and not self._may_overlap():
            return self._land(self._take_inflight())
        out = self.scheduler.schedule()
        if out.is_empty:
            return self._land(self._take_inflight())
        self._mark_scheduled(out)
        try:
            launched = self._launch(out)
        except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
            log.exception("model step failed")
            outputs = self._land(self._take_inflight())
            self.scheduler.recompute_swapped(out.preempted)  # their swap-out may not have run
            return outputs + self._fail(self._requests_of(out), e)
        outputs = self._land(self._take_inflight())
        self.scheduler.update(out, skip_finished=True)
        for seq in launched.seqs:
            if not seq.is_finished:
                seq.token_ids.append(PLACEHOLDER)
        self._inflight = launched
        if not self.overlap:
            outputs += self._land(self._take_inflight())
        return outputs

    def _may_overlap(self) -> bool:
        """Not while an n > 1 request lives: its forks are made on the host when its prompt
        is done, so its next step needs the last one's result first."""
        return not self._forking

    def _take_inflight(self) -> _Launched | None:
        launched, self._inflight = self._inflight, None
        return launched

    def _mark_scheduled(self, out) -> None:
        now = time.monotonic()
        for item in out.scheduled:
            metrics = self.requests[item.seq.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now

    def _launch(self, out) -> _Launched:
        prev = self._inflight
        # A step that finished no prompt sampled nothing, and left no placeholder.
        pending = PendingTokens(prev.future.tokens, prev.rows) if prev is not None and prev.future else None
        seqs, logits = self.runner.execute(out, pending)
        touched = self._requests_of(out)
        if not seqs:
            return _Launched(out, touched, [], None, {})
        owners, rows = self._owners(out, seqs)
        if len(rows) != len(seqs):
            logits = logits[to_device(rows, torch.long, logits.device)]
        states = [self.seq_states[s.seq_id].sampling for s in owners]
        future = self.sampler.launch(logits, states, self._pending_for(owners, prev))
        return _Launched(out, touched, owners, future, {s.seq_id: i for i, s in enumerate(owners)})

    def _owners(self, out, seqs: list[Sequence]) -> tuple[list[Sequence], list[int]]:
        """The sequences each sampled row is for, and their rows: an n > 1 request whose
        prompt just finished samples its forks from the parent's row."""
        if not self._forking:
            return seqs, list(range(len(seqs)))
        tokens_this_step = {s.seq.seq_id: s.num_tokens for s in out.scheduled}
        owners, rows = [], []
        for i, seq in enumerate(seqs):
            group = self._fork_if_first(seq, tokens_this_step[seq.seq_id])
            owners += group
            rows += [i] * len(group)
        return owners, rows

    @staticmethod
    def _pending_for(seqs: list[Sequence], prev: _Launched | None) -> LastTokens | None:
        """Where each sequence's placeholder token sits in the previous step's samples."""
        if prev is None or prev.future is None:
            return None
        rows = [prev.rows.get(s.seq_id) if s.token_ids[-1] == PLACEHOLDER else None for s in seqs]
        return LastTokens(prev.future.tokens, rows)

    def _land(self, launched: _Launched | None) -> list[RequestOutput]:
        """Take a launched step's tokens in: append, check stops, emit its requests' outputs."""
        if launched is None:
            return []
        if launched.future is not None:
            try:
                samples = launched.future.result()
            except Exception as e:  # noqa: BLE001 - as a failed launch
                log.exception("model step failed")
                return self._fail(launched.touched, e)
            self._take_tokens(launched.seqs, samples)
        requests = self.requests
        return [self._emit(rs) for rid, rs in launched.touched.items() if requests.get(rid) is rs]

    def _requests_of(self, out: SchedulerOutput) -> dict[str, RequestState]:
        return {s.seq.request_id: self.requests[s.seq.request_id] for s in out.scheduled}

    def _take_tokens(self, seqs: list[Sequence], samples: Samples) -> None:
        """Take each live sequence's token in: record it, its text, its stops. A token whose
        taking in fails fails its own request alone."""
        states = self.seq_states
        tokens, stats = samples.token_ids, samples.stats
        for i, seq in enumerate(seqs):
            state = states.get(seq.seq_id)
            if state is None or seq.is_finished:  # aborted or stopped meanwhile
                continue
            token = tokens[i]
            try:
                reason = self._record_token(state, token, stats[i] if stats is not None else None)
                self._finish_if_done(state, reason, state.detok.add(token) if reason is None else "")
            except Exception as e:  # noqa: BLE001
                self._token_failed(state, e)

    def _token_failed(self, state: SeqState, error: Exception) -> None:
        log.exception("taking in a token failed")
        self._fail_quietly(state.request, error)

    def _fork_if_first(self, seq: Sequence, num_tokens: int) -> list[Sequence]:
        """When the prompt of an n > 1 request is done (in this step, of num_tokens), its forks
        share the prompt blocks, computed as of the end of the step."""
        rs = self.requests[seq.request_id]
        n = rs.request.params.n
        if n == 1 or len(rs.seqs) == n:
            return [seq]
        forks = []
        for index in range(1, n):
            child = self._new_seq(rs, index, list(seq.token_ids))
            child.num_computed_tokens = seq.num_computed_tokens + num_tokens
            child.num_cached_tokens = seq.num_cached_tokens
            self.block_manager.fork(seq, child)
            self.block_manager.commit_full_blocks(child)
            self.scheduler.add_running(child)
            forks.append(child)
        return [seq, *forks]

    def _record_token(self, state: SeqState, token: int, stats: SampledToken | None) -> str | None:
        """Store the token (over its placeholder); "stop" for a stop token or EOS, whose text
        is never shown; otherwise None (the token's text is to be taken).
        stats: the token's logprob figures, present when its request asked for logprobs."""
        seq, rs = state.seq, state.request
        params = rs.request.params
        ids = seq.token_ids
        if ids[-1] == PLACEHOLDER:
            ids[-1] = token
        else:
            ids.append(token)
        state.sampling.output_token_ids.append(token)
        self.generation_tokens_total += 1
        if rs.metrics.first_token_time is None:
            rs.mark_token()
        if state.logprobs is not None:
            state.logprobs.append(token_logprobs(stats, self._decode_one))
        # The sampler keeps EOS and stop tokens out until min_tokens, so no check is needed here.
        if token in params.stop_token_ids:
            state.stop_reason = token
            return "stop"
        if not params.ignore_eos and token in state.sampling.eos_token_ids:
            return "stop"
        return None

    def _finish_if_done(self, state: SeqState, reason: str | None, delta: str) -> None:
        seq, stops = state.seq, state.stops
        if reason is None:
            if stops.active:
                delta, hit = stops.feed(delta)
                if hit:
                    state.stop_reason = stops.matched
                    reason = "stop"
            state.text += delta
        if reason is None and seq.num_output_tokens >= state.request.max_tokens:
            reason = "length"
        if reason is not None:
            if not stops.hit:  # text held back for a possible stop string is real text
                safe, _ = stops.feed(state.detok.flush())
                state.text += safe + (stops.flush() if not stops.hit else "")
            self.scheduler.finish(seq, reason)

    def _decode_one(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _emit(self, rs: RequestState) -> RequestOutput:
        finished = rs.finished
        output = build_output(rs, finished)
        if finished:
            for s in rs.seqs:
                self.finished_by_reason[s.seq.finish_reason or "error"] += 1
            self._forget(rs)
            del self.requests[rs.request.request_id]
        return output

    def _forget(self, rs: RequestState) -> None:
        self._forking.discard(rs)
        for s in rs.seqs:
            self.seq_states.pop(s.seq.seq_id, None)
            s.request = None  # breaks the request <-> state cycle: freed without the GC

    def _fail(self, requests: dict[str, RequestState], error: Exception) -> list[RequestOutput]:
        outputs = []
        for rid, rs in requests.items():
            if self.requests.get(rid) is not rs:  # finished, or its id reused since
                continue
            self._fail_quietly(rs, error)
            outputs.append(self._emit(rs))
        return outputs

    def _fail_quietly(self, rs: RequestState, error: Exception) -> None:
        """Mark rs failed and free its sequences; its output goes out with the others."""
        rs.error = rs.error or f"{type(error).__name__}: {error}"
        for s in rs.seqs:
            if not s.seq.is_finished:
                self.scheduler.finish(s.seq, "error")
