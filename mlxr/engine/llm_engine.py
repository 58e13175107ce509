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
from mlxr.engine.detokenizer import StopStringMatcher, make_detokenizer
from mlxr.engine.kv_cache import KVCache, num_blocks_for_memory
from mlxr.engine.model_runner import ModelRunner
from mlxr.engine.request_state import RequestState, SeqState, build_output
from mlxr.engine.sampler import Sampler, SamplingState, make_generator
from mlxr.engine.scheduler import Scheduler, SchedulerConfig
from mlxr.engine.sequence import Request, Sequence
from mlxr.engine.step_loop import StepLoop
from mlxr.errors import ContextLengthError, InvalidParameterError, OverloadedError
from mlxr.types import EngineStats, RequestMetrics, RequestOutput, SamplingParams

log = logging.getLogger(__name__)


_GC_TUNED = False
# The cyclic collector's thresholds while an engine lives: (young objects, young collections
# a middle one, middle collections a full one). A decode step at batch 256 leaves over a
# thousand tracked objects (outputs, deltas) that reference counting frees soon after, so
# Python's default (700, 10, 10) ran about two young collections a step (counted with
# gc.callbacks on bench/host_phases.py's fixture), and full ones often, for nothing: the engine
# breaks its own cycles. Interleaved runs on one H200 host: batch 256 decode median 98.8k
# tok/s with the defaults, 102.7k with these (bench/gc_ab.py, gc_ab-20261124T123005Z.json).
GC_THRESHOLDS = (50_000, 50, 100)


def _tune_gc_once() -> None:
    """Once per process, after the first model loads: freeze the objects of loading (weights'
    Python wrappers, vocabularies), which live on and which every full collection walked
    (~100 ms pauses of a busy decode loop), and raise the collector's thresholds (never
    lowering one the application set). Later loads stay collectable."""
    global _GC_TUNED
    if not _GC_TUNED:
        _GC_TUNED = True
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)  # frozen objects are never freed at exit; bindings complain
        gc.set_threshold(*(max(now, want) for now, want in zip(gc.get_threshold(), GC_THRESHOLDS)))


@dataclass(frozen=True)
class EngineParts:
    """What a loaded model gives the engine."""

    model: torch.nn.Module
    args: ModelArgs
    tokenizer: object  # mlxr.loader.tokenizer.Tokenizer (engine never imports the loader)
    dtype: torch.dtype
    device: torch.device


class LLMEngine(StepLoop):
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
        self._inflight = None  # the launched step not yet taken in (step_loop.py)
        self.requests: dict[str, RequestState] = {}
        self.seq_states: dict[int, SeqState] = {}
        self._forking: set[RequestState] = set()  # live n > 1 requests (step_loop.py)
        self._seq_ids = itertools.count()
        self.finished_by_reason: Counter[str] = Counter()
        self.num_aborted = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        _tune_gc_once()

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
        self._new_seq(rs, index=0, token_ids=list(ids))
        self.scheduler.add(req.seqs[0])
        self.requests[request_id] = rs
        if params.n > 1:
            self._forking.add(rs)
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
            make_detokenizer(self.tokenizer, req.prompt_token_ids),
            StopStringMatcher(params.stop),
            logprobs=[] if params.logprobs is not None else None,
            request=rs,
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
