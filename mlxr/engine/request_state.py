"""Per-request bookkeeping in the engine: text, stop strings, logprobs, timings, outputs."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mlxr.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher, StreamDetokenizer
from mlxr.engine.sampler import SampledToken, SamplingState
from mlxr.engine.sequence import PLACEHOLDER, Request, Sequence
from mlxr.types import CompletionOutput, Logprob, RequestMetrics, RequestOutput, TokenLogprobs


@dataclass(eq=False)
class SeqState:
    seq: Sequence
    sampling: SamplingState
    detok: IncrementalDetokenizer | StreamDetokenizer
    stops: StopStringMatcher
    text: str = ""
    logprobs: list[TokenLogprobs] | None = None
    stop_reason: str | int | None = None
    sent_text: int = 0  # how much of text/tokens/logprobs earlier deltas carried
    sent_tokens: int = 0
    request: RequestState | None = None  # its request's state (saves a lookup per token)


@dataclass(eq=False)
class RequestState:
    request: Request
    metrics: RequestMetrics
    stream_deltas: bool
    max_tokens: int
    seqs: list[SeqState] = field(default_factory=list)
    error: str | None = None
    aborted: bool = False  # an n > 1 request may be aborted before its forks exist

    def mark_token(self) -> None:
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = time.monotonic()

    @property
    def finished(self) -> bool:
        return self.error is not None or self.aborted or self.request.is_finished


def token_logprobs(sample: SampledToken, decode) -> TokenLogprobs:
    entry = {sample.token_id: Logprob(sample.logprob, sample.rank, decode(sample.token_id))}
    for rank, (tok, lp) in enumerate(sample.top_logprobs, start=1):
        if tok not in entry:
            entry[tok] = Logprob(lp, rank, decode(tok))
    return entry


def completion_of(state: SeqState, delta: bool) -> CompletionOutput:
    seq = state.seq
    text_from, tok_from = (state.sent_text, state.sent_tokens) if delta else (0, 0)
    ids = seq.token_ids
    end = len(ids) - (1 if ids and ids[-1] == PLACEHOLDER else 0)
    logprobs = state.logprobs[tok_from:] if state.logprobs is not None else None
    # Positional: this runs for every running sequence every step. (index, text, token_ids
    # of the new part only, finish_reason, logprobs, stop_reason)
    out = CompletionOutput(seq.index, state.text[text_from:], ids[seq.num_prompt_tokens + tok_from : end],
                           seq.finish_reason, logprobs, state.stop_reason)
    if delta:
        state.sent_text, state.sent_tokens = len(state.text), end - seq.num_prompt_tokens
    return out


def build_output(rs: RequestState, finished: bool | None = None) -> RequestOutput:
    """The request's output now (finished: rs.finished, when the caller has it already).
    Runs for every running request every step, hence the plain code."""
    req = rs.request
    if finished is None:
        finished = rs.finished
    if finished and rs.metrics.finished_time is None:
        rs.metrics.finished_time = time.monotonic()
    seqs = rs.seqs
    if len(seqs) == 1:
        outputs = [completion_of(seqs[0], rs.stream_deltas)]
    else:
        outputs = [completion_of(s, rs.stream_deltas) for s in sorted(seqs, key=lambda s: s.seq.index)]
    cached = seqs[0].seq.num_cached_tokens if seqs else 0
    return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outputs, finished, rs.metrics,
                         rs.error, cached)
