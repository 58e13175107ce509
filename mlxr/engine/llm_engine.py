"""The synchronous engine: add_request / step / abort over scheduler, runner and sampler."""
from __future__ import annotations

import atexit
import gc
import itertools
from collections import Counter
import logging
import time
from dataclasses import dataclass

import torch

from mlxr.config import EngineConfig, ModelArgs
from mlxr.engine.block_manager import BlockManager, SwapSpace
from mlxr.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher, advance_all
from mlxr.engine.kv_cache import KVCache, num_blocks_for_memory
from mlxr.engine.model_runner import ModelRunner, PendingTokens
from mlxr.engine.request_state import RequestState, SeqState, build_output, token_logprobs
from mlxr.engine.sampler import LastTokens, SampleFuture, Sampler, SamplingState, make_generator
from mlxr.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from mlxr.engine.sequence import PLACEHOLDER, Request, Sequence
from mlxr.engine.staging import to_device
from mlxr.errors import ContextLengthError, InvalidParameterError, OverloadedError
from mlxr.types import EngineStats, RequestMetrics, RequestOutput, SamplingParams

log = logging.getLogger(__name__)


_FROZEN = False


def _freeze_startup_objects() -> None:
    """Once per process, after the first model loads: the objects of loading (weights' Python
    wrappers, vocabularies) live on, and the cyclic collector walking them in every full
    collection paused a busy decode loop for ~100 ms. Later loads stay collectable."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)  # frozen objects are never freed at exit; bindings complain


@dataclass
class _Launched:
    """A step queued on the device whose sampled tokens the host has not taken in yet."""

    out: SchedulerOutput
    touched: dict[str, RequestState]  # the requests scheduled in the step (an id may be reused later)
    seqs: list[Sequence]  # the sampled sequences, in row order
    future: SampleFuture | None
    rows: dict[int, int]  # seq_id -> row of future.tokens


@dataclass(frozen=True)
class EngineParts:
    """What a loaded model gives the engine."""

    model: torch.nn.Module
    args: ModelArgs
    tokenizer: object  # mlxr.loader.tokenizer.Tokenizer (engine never imports the loader)
    dtype: torch.dtype
    device: torch.device


class LLMEngine:
    def __init__(self, parts: EngineParts, config: EngineConfig = EngineConfig()) -> None:
        self.parts, self.config = parts, config
        self.tokenizer = parts.tokenizer
        num_blocks = config.num_kv_blocks or self._auto_num_blocks()
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.max_model_len = self._max_model_len(num_blocks)
        host_blocks = (
            num_blocks_for_memory(parts.args, config.block_size, parts.dtype, config.swap_space_gb)
            if config.swap_space_gb > 0
            else 0
        )
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len),
            self.block_manager,
            SwapSpace(host_blocks) if host_blocks else None,
        )
        # One block past the manager's range: a scratch block for CUDA-graph padding rows.
        kv = KVCache(parts.args, num_blocks + 1, config.block_size, parts.dtype, parts.device, host_blocks)
        self.runner = ModelRunner(parts.model, kv, parts.device)
        if parts.device.type == "cuda" and config.enable_cuda_graphs:
            self.runner.enable_cuda_graphs(
                num_blocks, min(config.max_num_seqs, config.cuda_graph_max_batch),
                self.block_manager.blocks_for(self.max_model_len),
                min(config.max_num_batched_tokens, self.max_model_len) if config.enable_prefill_graphs else 0,
            )
        self.sampler = Sampler()
        # Overlap the host's work with the device's only where the device runs asynchronously.
        auto = parts.device.type == "cuda"
        self.overlap = auto if config.overlap_steps is None else config.overlap_steps
        self._inflight: _Launched | None = None
        self.requests: dict[str, RequestState] = {}
        self.seq_states: dict[int, SeqState] = {}
        self._seq_ids = itertools.count()
        self.finished_by_reason: Counter[str] = Counter()
        self.num_aborted = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # The objects of loading (weights' Python wrappers, vocabularies) live as long as the
        # engine: keep the cyclic collector from walking them again in every full collection,
        # which otherwise pauses a busy decode loop for ~100 ms.
        _freeze_startup_objects()

    def _auto_num_blocks(self) -> int:
        """The memory budget's worth of blocks, but no more than max_num_seqs full-length
        sequences can use (plus room for cached prefixes), so small models stay small."""
        config, args = self.config, self.parts.args
        budget = num_blocks_for_memory(args, config.block_size, self.parts.dtype, config.kv_cache_memory_gb)
        context = config.max_model_len or args.max_position_embeddings
        useful = 2 * config.max_num_seqs * -(-context // config.block_size)
        return min(budget, useful)

    def _max_model_len(self, num_blocks: int) -> int:
        cache_tokens = num_blocks * self.config.block_size
        limit = self.config.max_model_len or self.parts.args.max_position_embeddings
        if cache_tokens < limit:
            log.info("max_model_len %d capped to the KV cache's %d tokens", limit, cache_tokens)
        return min(limit, cache_tokens)

    # --- requests -----------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        stream_deltas: bool = False,
        arrival_time: float | None = None,
    ) -> None:
        if request_id in self.requests:
            raise InvalidParameterError("request_id", f"{request_id!r} is already running")
        text, ids = self._tokenize(prompt)
        max_tokens = self._check_admission(ids, params)
        now = arrival_time or time.monotonic()
        req = Request(request_id, text, ids, params, now)
        rs = RequestState(req, RequestMetrics(now), stream_deltas, max_tokens)
        self.requests[request_id] = rs
        self._new_seq(rs, index=0, token_ids=list(ids))
        self.scheduler.add(req.seqs[0])
        self.prompt_tokens_total += len(ids)

    def _tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        vocab = self.parts.args.vocab_size
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt), prompt
            if ids and max(ids) >= vocab:  # a tokenizer with added tokens past the embedding
                raise InvalidParameterError("prompt", f"the text encodes to token ids past the model's vocabulary of {vocab}")
        else:
            ids, text = list(prompt), None
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise InvalidParameterError("prompt", f"token ids must be integers in [0, {vocab})")
        if not ids:
            raise InvalidParameterError("prompt", "the prompt is empty")
        return text, ids

    def _check_admission(self, ids: list[int], params: SamplingParams) -> int:
        """Refuse what can never run; returns the effective max_tokens. Without max_tokens
        a request may fill the context; with it, prompt + max_tokens must fit (as vLLM)."""
        vocab = self.parts.args.vocab_size
        for name, tokens in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)):
            if any(t >= vocab for t in tokens):
                raise InvalidParameterError(name, f"token ids must be below the vocabulary size {vocab}")
        limit = self.max_model_len
        if len(ids) >= limit:
            raise ContextLengthError(len(ids), limit)
        if params.max_tokens is not None and len(ids) + params.max_tokens > limit:
            raise ContextLengthError(len(ids), limit, params.max_tokens)
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise OverloadedError(f"{len(self.scheduler.waiting)} requests are already waiting")
        return params.max_tokens or limit - len(ids)

    def _new_seq(self, rs: RequestState, index: int, token_ids: list[int]) -> Sequence:
        req = rs.request
        seq = Sequence(next(self._seq_ids), req.request_id, index, token_ids, len(req.prompt_token_ids), req.arrival_time)
        seq.max_output_tokens = rs.max_tokens
        params = req.params
        seed = None if params.seed is None else (params.seed + index) % (1 << 64)
        sampling = SamplingState(
            params=params,
            prompt_token_ids=req.prompt_token_ids,
            output_token_ids=[],
            eos_token_ids=frozenset(self.tokenizer.stop_token_ids),
            generator=make_generator(seed, self.parts.device),
        )
        state = SeqState(
            seq,
            sampling,
            IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids),
            StopStringMatcher(params.stop),
            logprobs=[] if params.logprobs is not None else None,
        )
        req.seqs.append(seq)
        rs.seqs.append(state)
        self.seq_states[seq.seq_id] = state
        return seq

    def embed(self, prompt: str | list[int]) -> tuple[list[float], int]:
        """L2-normalised mean of the last hidden states (as llama.cpp and Ollama embed with
        decoder models); returns (vector, token count). Runs between steps, on the cache."""
        _, ids = self._tokenize(prompt)
        if len(ids) > self.max_model_len:
            raise ContextLengthError(len(ids), self.max_model_len)
        seq = Sequence(-1, "embed", 0, ids, len(ids), time.monotonic())
        need = self.block_manager.blocks_for(len(ids))
        if not self.block_manager.can_allocate(need):
            raise OverloadedError("the KV cache is busy; retry the embedding later")
        self.block_manager.allocate(seq, len(ids))
        try:
            hidden = self.runner.hidden_states(seq).float()
        finally:
            self.block_manager.free(seq)
        vec = torch.nn.functional.normalize(hidden.mean(0), dim=0)
        return vec.tolist(), len(ids)

    def abort(self, request_id: str) -> RequestOutput | None:
        rs = self.requests.pop(request_id, None)
        if rs is None:
            return None
        for s in rs.seqs:
            if not s.seq.is_finished:
                self.scheduler.finish(s.seq, "abort")
        rs.aborted = True
        self.num_aborted += 1
        self._forget(rs)
        return build_output(rs)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        sch, usage = self.scheduler, self.block_manager.usage()
        count = lambda seqs: len({s.request_id for s in seqs})  # noqa: E731
        return EngineStats(
            num_requests_running=count(sch.running),
            num_requests_waiting=count(sch.waiting),
            num_requests_swapped=count(sch.swapped),
            kv_blocks_total=usage.total,
            kv_blocks_used=usage.used,
            kv_blocks_cached=usage.cached,
            prefix_cache_queried_tokens=sch.counters.prefix_queried_tokens,
            prefix_cache_hit_tokens=sch.counters.prefix_hit_tokens,
            num_preemptions=sch.counters.num_preemptions,
            num_aborted=self.num_aborted,
            finished_by_reason=dict(self.finished_by_reason),
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
        )

    # --- one step ---------------------------------------------------------------------------
    # On CUDA a step is launched, then the previous step's tokens are taken in while the GPU
    # runs it: the new step reads each sequence's still-unknown token (a placeholder on the
    # host) from the previous step's sampled tokens on the device. A sequence that turns out
    # to have finished had one extra row computed, whose result is dropped. Rows whose
    # sampling reads earlier tokens on the host (penalties, min_tokens, n > 1 forks) make the
    # engine take the previous step in first.
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
        sch = self.scheduler
        return all(self.seq_states[s.seq_id].overlappable for q in (sch.running, sch.waiting, sch.swapped) for s in q)

    def _take_inflight(self) -> "_Launched | None":
        launched, self._inflight = self._inflight, None
        return launched

    def _mark_scheduled(self, out) -> None:
        now = time.monotonic()
        for item in out.scheduled:
            metrics = self.requests[item.seq.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now

    def _launch(self, out) -> "_Launched":
        prev = self._inflight
        # A step that finished no prompt sampled nothing, and left no placeholder.
        pending = PendingTokens(prev.future.tokens, prev.rows) if prev is not None and prev.future else None
        seqs, logits = self.runner.execute(out, pending)
        touched = self._requests_of(out)
        tokens_this_step = {s.seq.seq_id: s.num_tokens for s in out.scheduled}
        if not seqs:
            return _Launched(out, touched, [], None, {})
        owners, rows = [], []
        for i, seq in enumerate(seqs):
            group = self._fork_if_first(seq, tokens_this_step[seq.seq_id])
            owners += group
            rows += [i] * len(group)
        if len(rows) != len(seqs):
            logits = logits[to_device(rows, torch.long, logits.device)]
        states = [self.seq_states[s.seq_id].sampling for s in owners]
        future = self.sampler.launch(logits, states, self._pending_for(owners, prev))
        return _Launched(out, touched, owners, future, {s.seq_id: i for i, s in enumerate(owners)})

    @staticmethod
    def _pending_for(seqs: list[Sequence], prev: "_Launched | None") -> LastTokens | None:
        """Where each sequence's placeholder token sits in the previous step's samples."""
        if prev is None or prev.future is None:
            return None
        rows = [prev.rows.get(s.seq_id) if s.token_ids[-1] == PLACEHOLDER else None for s in seqs]
        return LastTokens(prev.future.tokens, rows)

    def _land(self, launched: "_Launched | None") -> list[RequestOutput]:
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
        return [self._emit(rid) for rid, rs in launched.touched.items() if self.requests.get(rid) is rs]

    def _requests_of(self, out: SchedulerOutput) -> dict[str, RequestState]:
        return {s.seq.request_id: self.requests[s.seq.request_id] for s in out.scheduled}

    def _take_tokens(self, seqs: list[Sequence], samples: list) -> None:
        """Record each live sequence's token, detokenize them all in one batch, then stop."""
        live = [(self.seq_states[seq.seq_id], sample) for seq, sample in zip(seqs, samples)
                if not seq.is_finished and seq.seq_id in self.seq_states]  # else aborted or stopped
        reasons = [self._guarded(state, self._record_token, state, sample) for state, sample in live]
        texting = [state for (state, _), reason in zip(live, reasons) if reason is None]
        deltas = iter(advance_all(self.tokenizer, [state.detok for state in texting]))
        for (state, _), reason in zip(live, reasons):
            delta = next(deltas) if reason is None else ""
            if reason != "error":
                self._guarded(state, self._finish_if_done, state, reason, delta)

    def _guarded(self, state: SeqState, fn, *args):
        """fn(*args); an error fails this sequence's request alone (returns "error")."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - one request's bad token must not fail the batch
            log.exception("taking in a token failed")
            self._fail_quietly(self.requests[state.seq.request_id], e)
            return "error"

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

    def _record_token(self, state: SeqState, sample) -> str | None:
        """Store the token (over its placeholder); "stop" for a stop token or EOS, whose text
        is never shown; otherwise the token goes to the detokenizer and None is returned."""
        seq, rs = state.seq, self.requests[state.seq.request_id]
        params, token = rs.request.params, sample.token_id
        if seq.token_ids[-1] == PLACEHOLDER:
            seq.token_ids[-1] = token
        else:
            seq.token_ids.append(token)
        state.sampling.output_token_ids.append(token)
        self.generation_tokens_total += 1
        rs.mark_token()
        if state.logprobs is not None:
            state.logprobs.append(token_logprobs(sample, self._decode_one))
        # The sampler keeps EOS and stop tokens out until min_tokens, so no check is needed here.
        if token in params.stop_token_ids:
            state.stop_reason = token
            return "stop"
        if not params.ignore_eos and token in state.sampling.eos_token_ids:
            return "stop"
        state.detok.push(token)
        return None

    def _finish_if_done(self, state: SeqState, reason: str | None, delta: str) -> None:
        seq, rs = state.seq, self.requests[state.seq.request_id]
        if reason is None:
            safe, hit = state.stops.feed(delta)
            state.text += safe
            if hit:
                state.stop_reason = state.stops.matched
                reason = "stop"
        if reason is None and seq.num_output_tokens >= rs.max_tokens:
            reason = "length"
        if reason is not None:
            if not state.stops.hit:  # text held back for a possible stop string is real text
                safe, _ = state.stops.feed(state.detok.flush())
                state.text += safe + (state.stops.flush() if not state.stops.hit else "")
            self.scheduler.finish(seq, reason)

    def _decode_one(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _emit(self, request_id: str) -> RequestOutput:
        rs = self.requests[request_id]
        finished = rs.finished
        output = build_output(rs, finished)
        if finished:
            for s in rs.seqs:
                self.finished_by_reason[s.seq.finish_reason or "error"] += 1
            self._forget(rs)
            del self.requests[request_id]
        return output

    def _forget(self, rs: RequestState) -> None:
        for s in rs.seqs:
            self.seq_states.pop(s.seq.seq_id, None)

    def _fail(self, requests: dict[str, RequestState], error: Exception) -> list[RequestOutput]:
        outputs = []
        for rid, rs in requests.items():
            if self.requests.get(rid) is not rs:  # finished, or its id reused since
                continue
            self._fail_quietly(rs, error)
            outputs.append(self._emit(rid))
        return outputs

    def _fail_quietly(self, rs: RequestState, error: Exception) -> None:
        """Mark rs failed and free its sequences; its output goes out with the others."""
        rs.error = rs.error or f"{type(error).__name__}: {error}"
        for s in rs.seqs:
            if not s.seq.is_finished:
                self.scheduler.finish(s.seq, "error")
