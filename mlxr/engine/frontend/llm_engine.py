"""The synchronous engine frontend: add_request / step / abort over an engine core client.

The frontend tokenizes, refuses what can never run, splits a request of n samples into n core
requests, and turns the core's token ids into RequestOutputs (output_processor.py). The core
runs in this process (InprocClient) or in its own (core_client.py's MPClient)."""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import msgspec

from mlxr.config import EngineConfig
from mlxr.engine.core.core_parts import CoreParts
from mlxr.engine.frontend.core_client import CoreClient, InprocClient
from mlxr.engine.frontend.output_processor import OutputProcessor, RequestState
from mlxr.engine.frontend.processor import Limits, Processor
from mlxr.engine.records import EngineCoreRequest, TokenLogprob
from mlxr.errors import EngineDeadError, InvalidParameterError, ModelNotFoundError, OverloadedError
from mlxr.types import EngineStats, ImagePrompt, ImagePromptIds, RequestMetrics, RequestOutput, SamplingParams, TokenLogprobs
from mlxr.vision.image_prompt import check_takes_images, image_prompt_ids

log = logging.getLogger(__name__)

# The core's cumulative counters (its EngineStats fields) that forget_counts starts over.
_CORE_COUNTERS = ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "num_preemptions", "spec_num_drafts",
                  "spec_num_draft_tokens", "spec_num_accepted_tokens", "jump_forward_drafts",
                  "jump_forward_draft_tokens", "jump_forward_accepted_tokens", "vision_encoder_calls")


class LLMEngine:
    def __init__(self, parts: CoreParts, config: EngineConfig = EngineConfig(),
                 core: CoreClient | None = None) -> None:
        """parts: the loaded model (with its tokenizer); a core client given runs the core
        elsewhere, and then only parts.args and parts.tokenizer are read."""
        self.config = config
        self.tokenizer = parts.tokenizer
        self.args = parts.args
        self.core = core or InprocClient(parts, config)
        self.max_model_len = self.core.max_model_len
        self.processor = Processor(self.tokenizer, Limits(parts.args.vocab_size, self.max_model_len))
        self.output = OutputProcessor(self.tokenizer)
        self._eos = sorted(self.tokenizer.stop_token_ids)
        self._forks: dict[str, list[EngineCoreRequest]] = {}  # samples 1.. of n > 1, sent later
        self.num_aborted = 0
        self.prompt_tokens_total = 0
        self._core_base: EngineStats | None = None  # the core's counters when they were last forgotten
        self._lora_names: list[str] | None = None  # asked of the core once, then kept by load/unload

    # --- requests -----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    stream_deltas: bool = False, arrival_time: float | None = None, lora_name: str = "") -> None:
        """lora_name: a loaded LoRA adapter's name (load_lora); "": the base model."""
        if request_id in self.output.requests:
            raise InvalidParameterError("request_id", f"{request_id!r} is already running")
        if lora_name and lora_name not in self.lora_names:
            raise ModelNotFoundError(f"The model `{lora_name}` does not exist: no LoRA adapter of that name is loaded.")
        images: list = []
        if isinstance(prompt, ImagePrompt):
            prompt = image_prompt_ids(prompt, self.args.vision, self.tokenizer)
        if isinstance(prompt, ImagePromptIds):
            check_takes_images(self.args.vision, len(prompt.images))
            text, ids, images = None, list(prompt), prompt.images
            self.processor.check_ids(ids)
        else:
            text, ids = self.processor.tokenize(prompt)
        max_tokens = self.processor.max_tokens(ids, params)
        waiting = sum(1 for rs in self.output.requests.values() if rs.metrics.first_scheduled_time is None)
        if waiting >= self.config.max_waiting:
            raise OverloadedError(f"{waiting} requests are already waiting")
        now = arrival_time or time.monotonic()
        core_reqs = [self._core_request(request_id, i, ids, params, max_tokens, now, images, lora_name)
                     for i in range(params.n)]
        rs = RequestState(request_id, text, ids, params, RequestMetrics(now), stream_deltas)
        if params.prompt_logprobs is not None:  # before anything is queued: a busy cache refuses the request
            rs.prompt_logprobs = self.logprob_entries(self.core.prompt_logprobs(ids, params.prompt_logprobs))
        self.output.add(rs, [r.request_id for r in core_reqs])
        # The other samples start once the first has computed the prompt: they find its full
        # blocks in the prefix cache instead of computing them again.
        if len(core_reqs) > 1:
            self._forks[core_reqs[0].request_id] = core_reqs[1:]
        self.core.add_requests(core_reqs[:1])
        self.prompt_tokens_total += len(ids)

    def _core_request(self, request_id: str, index: int, ids: list[int], params: SamplingParams,
                      max_tokens: int, now: float, images: list, lora_name: str = "") -> EngineCoreRequest:
        if params.n == 1:
            return EngineCoreRequest(request_id, ids, params, max_tokens, self._eos, now, images, lora_name)
        seed = None if params.seed is None else (params.seed + index) % (1 << 64)
        sample = replace(params, n=1, seed=seed)
        return EngineCoreRequest(f"{request_id}#{index}", ids, sample, max_tokens, self._eos, now, images, lora_name)

    # --- LoRA adapters -------------------------------------------------------------------------
    @property
    def lora_names(self) -> list[str]:
        """The LoRA adapters loaded in the core, by name."""
        if self._lora_names is None:
            self._lora_names = self.core.lora("list") if self.config.enable_lora or self.config.lora_modules else []
        return self._lora_names

    def load_lora(self, name: str, path: str) -> None:
        self._lora_names = self.core.lora("load", name, path)

    def unload_lora(self, name: str) -> None:
        self._lora_names = self.core.lora("unload", name)

    def step(self) -> list[RequestOutput]:
        try:
            core_outputs = self.core.step()
        except EngineDeadError as e:
            log.error("%s; failing the %d requests in flight", e, len(self.output.requests))
            self._forks.clear()
            return self.output.fail(str(e))
        outputs, to_abort = self.output.process(core_outputs)
        if self._forks:
            self._send_forks(outputs)
        if to_abort:
            self.core.abort_requests(to_abort)
        return outputs

    def _send_forks(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            first = f"{out.request_id}#0"
            if first in self._forks and (out.outputs[0].token_ids or out.finished):
                forks = self._forks.pop(first)
                if not out.finished:
                    self.core.add_requests(forks)

    def abort(self, request_id: str) -> RequestOutput | None:
        out, core_ids = self.output.abort(request_id)
        if out is None:
            return None
        self._forks.pop(f"{request_id}#0", None)
        self.core.abort_requests(core_ids)
        self.num_aborted += 1
        return out

    def has_unfinished(self) -> bool:
        return bool(self.output.requests)

    def embed(self, prompt: str | list[int]) -> tuple[list[float], int]:
        """L2-normalised mean of the last hidden states (as llama.cpp and Ollama embed with
        decoder models); returns (vector, token count)."""
        _, ids = self.processor.tokenize(prompt)
        return self.core.embed(ids), len(ids)

    def prompt_logprobs(self, prompt: str | list[int], top: int) -> tuple[list[int], list[TokenLogprobs | None]]:
        """The prompt's token ids and, for each, its logprob given the tokens before it with
        the `top` likeliest alternatives (None for the first token, as vLLM gives)."""
        ids, scored = self.score_prompt(prompt, top)
        return ids, self.logprob_entries(scored)

    def score_prompt(self, prompt: str | list[int], top: int, first: int = 0) -> tuple[list[int], list[TokenLogprob]]:
        """prompt_logprobs' engine work (the forward, between steps), without the decoding; from
        `first` on, the figures of the tokens after position first (perplexity scores the second
        half of a chunk: the lm_head runs for those positions only)."""
        _, ids = self.processor.tokenize(prompt)
        if not 0 <= first < max(len(ids), 1):
            raise InvalidParameterError("first", f"must be a position of the {len(ids)}-token prompt")
        return ids, self.core.prompt_logprobs(ids, top, first)

    def logprob_entries(self, scored: list[TokenLogprob]) -> list[TokenLogprobs | None]:
        """Scored prompt tokens as output entries (texts decoded; any thread may call this)."""
        return [None] + [self.output.logprob_entry(lp) for lp in scored]

    def forget_counts(self, core: bool = True) -> None:
        """Count requests and tokens from now on (after the server's own warm-up requests): this
        side's counters start over; with `core`, the core's are reported less what they were now."""
        self.num_aborted = 0
        self.prompt_tokens_total = 0
        self.output.forget_counts()
        if core:
            self._core_base = self.core.stats()

    def _core_counts(self) -> EngineStats:
        """The core's stats with its counters since forget_counts (all of them after a restarted
        core, whose counters began again below the base)."""
        core, base = self.core.stats(), self._core_base
        if base is None or core.prefix_cache_queried_tokens < base.prefix_cache_queried_tokens:
            self._core_base = None
            return core
        since = {f: getattr(core, f) - getattr(base, f) for f in _CORE_COUNTERS}
        per_pos = list(core.spec_accepted_per_position)
        for j, n in enumerate(base.spec_accepted_per_position[:len(per_pos)]):
            per_pos[j] -= n
        return msgspec.structs.replace(core, spec_accepted_per_position=tuple(per_pos), **since)

    def stats(self) -> EngineStats:
        """The core's stats (its counters since forget_counts) with this frontend's counts."""
        return msgspec.structs.replace(
            self._core_counts(),
            num_aborted=self.num_aborted,
            finished_by_reason=dict(self.output.finished_by_reason),
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.output.generation_tokens_total,
        )

    @property
    def on_gpu(self) -> bool:
        return self.core.on_gpu

    @property
    def core_alive(self) -> bool:
        return self.core.alive()

    def shutdown(self) -> None:
        self.core.shutdown()
