"""The frontend's half of a request: turns the core's token ids into text (detokenize, stop
strings, logprob texts), merges a request's n samples and builds RequestOutputs. A stop string
that matches ends the sample here and is reported for the core to abort."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from mlxr.engine.frontend.detokenizer import IncrementalDetokenizer, StopStringMatcher, StreamDetokenizer, make_detokenizer
from mlxr.engine.records import EngineCoreOutput, TokenLogprob
from mlxr.types import CompletionOutput, Logprob, RequestMetrics, RequestOutput, SamplingParams, TokenLogprobs

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SampleState:
    """One of a request's n samples, as the frontend sees it."""

    index: int
    core_id: str
    detok: IncrementalDetokenizer | StreamDetokenizer
    stops: StopStringMatcher
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    sent_text: int = 0  # how much of text/tokens/logprobs earlier deltas carried
    sent_tokens: int = 0


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    stream_deltas: bool
    samples: list[SampleState] = field(default_factory=list)
    error: str | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # SamplingParams.prompt_logprobs

    @property
    def finished(self) -> bool:
        if self.error is not None:
            return True
        for s in self.samples:  # a loop, not all(genexpr): read for every request every step
            if s.finish_reason is None:
                return False
        return True


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._stop_ids = tokenizer.stop_token_ids
        self.requests: dict[str, RequestState] = {}
        self._by_core_id: dict[str, tuple[RequestState, SampleState]] = {}
        self.generation_tokens_total = 0
        self.finished_by_reason: dict[str, int] = {}

    def forget_counts(self) -> None:
        self.generation_tokens_total = 0
        self.finished_by_reason = {}

    def add(self, rs: RequestState, core_ids: list[str]) -> None:
        params = rs.params
        for index, core_id in enumerate(core_ids):
            sample = SampleState(index, core_id, make_detokenizer(self.tokenizer, rs.prompt_token_ids, params.skip_special_tokens),
                                 StopStringMatcher(params.stop), logprobs=[] if params.logprobs is not None else None)
            rs.samples.append(sample)
            self._by_core_id[core_id] = (rs, sample)
        self.requests[rs.request_id] = rs

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """The RequestOutputs of a step's core outputs (one per touched request) and the core
        ids whose sample a stop string ended (the caller aborts them in the core)."""
        touched: dict[str, RequestState] = {}
        to_abort: list[str] = []
        by_core = self._by_core_id
        for out in outputs:
            entry = by_core.get(out.request_id)
            if entry is None:  # aborted or finished here already
                continue
            rs, sample = entry
            touched[rs.request_id] = rs
            try:
                self._take(rs, sample, out)
            except Exception as e:  # noqa: BLE001 - a token that cannot be taken in fails its request alone
                log.exception("taking in a token failed")
                rs.error = rs.error or f"{type(e).__name__}: {e}"
                sample.finish_reason = "error"
            if sample.finish_reason is not None:
                del by_core[out.request_id]
                if out.finish_reason is None:
                    to_abort.append(out.request_id)
                if rs.error is not None:  # an error fails the whole request
                    to_abort += self._finish_rest(rs, "error")
        return [self._emit(rs) for rs in touched.values()], to_abort

    def _take(self, rs: RequestState, sample: SampleState, out: EngineCoreOutput) -> None:
        metrics = rs.metrics
        if out.first_scheduled_time is not None and metrics.first_scheduled_time is None:
            metrics.first_scheduled_time = out.first_scheduled_time
        if out.error is not None:
            rs.error = rs.error or out.error
            sample.finish_reason = "error"
            return
        tokens = out.new_token_ids
        if not tokens:
            return
        if metrics.first_token_time is None:
            metrics.first_token_time = time.monotonic()
        if out.num_cached_tokens:
            rs.num_cached_tokens = out.num_cached_tokens
        self.generation_tokens_total += len(tokens)
        sample.token_ids += tokens
        if sample.logprobs is not None and out.new_logprobs:
            sample.logprobs += [self.logprob_entry(lp) for lp in out.new_logprobs]
        # A stop token or EOS ends the sample without its text (a grammar's last token has text).
        ends_on_stop_token = out.stop_reason is not None or tokens[-1] in self._stop_ids
        shown = tokens[:-1] if out.finish_reason == "stop" and ends_on_stop_token else tokens
        for token in shown:
            if self._add_text(sample, sample.detok.add(token)):
                return
        if out.finish_reason is not None:
            self._finish(sample, out.finish_reason, out.stop_reason)

    def _add_text(self, sample: SampleState, delta: str) -> bool:
        """Append delta, held back where a stop string may begin; True when one matched."""
        stops = sample.stops
        if stops.active:
            delta, hit = stops.feed(delta)
            if hit:
                sample.text += delta
                self._finish(sample, "stop", stops.matched)
                return True
        sample.text += delta
        return False

    def _finish(self, sample: SampleState, reason: str, stop_reason: str | int | None) -> None:
        stops = sample.stops
        if not stops.hit:  # text held back for a possible stop string is real text
            safe, _ = stops.feed(sample.detok.flush())
            sample.text += safe + (stops.flush() if not stops.hit else "")
        sample.finish_reason = reason
        sample.stop_reason = stop_reason if stop_reason is not None else sample.stop_reason

    def _finish_rest(self, rs: RequestState, reason: str) -> list[str]:
        """Finish rs's other samples (an error or an abort); their core ids."""
        ids = []
        for s in rs.samples:
            if s.finish_reason is None:
                s.finish_reason = reason
                self._by_core_id.pop(s.core_id, None)
                ids.append(s.core_id)
        return ids

    def abort(self, request_id: str) -> tuple[RequestOutput | None, list[str]]:
        """The final output of an aborted request and the core ids to abort."""
        rs = self.requests.get(request_id)
        if rs is None:
            return None, []
        ids = self._finish_rest(rs, "abort")
        return self._emit(rs), ids

    def fail(self, error: str) -> list[RequestOutput]:
        """Fail every request in flight (the core died)."""
        outputs = []
        for rs in list(self.requests.values()):
            rs.error = rs.error or error
            self._finish_rest(rs, "error")
            outputs.append(self._emit(rs))
        return outputs

    def logprob_entry(self, lp: TokenLogprob) -> TokenLogprobs:
        """The chosen token and its top alternatives, each with its rank and text."""
        decode = self._decode_one
        entry = {lp.token_id: Logprob(lp.logprob, lp.rank, decode(lp.token_id))}
        for rank, (tok, value) in enumerate(lp.top, start=1):
            if tok not in entry:
                entry[tok] = Logprob(value, rank, decode(tok))
        return entry

    def _decode_one(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _emit(self, rs: RequestState) -> RequestOutput:
        finished = rs.finished
        if finished:
            if rs.metrics.finished_time is None:
                rs.metrics.finished_time = time.monotonic()
            for s in rs.samples:
                reason = s.finish_reason or "error"
                self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
            self.requests.pop(rs.request_id, None)
        outputs = [self._completion(s, rs.stream_deltas) for s in rs.samples]
        return RequestOutput(rs.request_id, rs.prompt, rs.prompt_token_ids, outputs, finished, rs.metrics,
                             rs.error, rs.num_cached_tokens, rs.prompt_logprobs)

    @staticmethod
    def _completion(s: SampleState, delta: bool) -> CompletionOutput:
        text_from, tok_from = (s.sent_text, s.sent_tokens) if delta else (0, 0)
        logprobs = s.logprobs[tok_from:] if s.logprobs is not None else None
        out = CompletionOutput(s.index, s.text[text_from:], s.token_ids[tok_from:], s.finish_reason, logprobs,
                               s.stop_reason)
        if delta:
            s.sent_text, s.sent_tokens = len(s.text), len(s.token_ids)
        return out
