"""The engine core: the one owner of the step. It holds the device, the KV cache, the scheduler
and the model runner; it sees token ids only (the frontend tokenizes and detokenizes).

A step: schedule -> execute (forward, grammar-mask slot, sample; queued on the device) ->
land the previous step (scheduler.update_from_output decides finishing and frees blocks).
On CUDA the previous step lands while the device runs this one (overlap); elsewhere a step
lands at once. The steps queued and not landed have one owner, StepsInFlight (in_flight.py)."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from mlxr.config import EngineConfig, ModelArgs
from mlxr.engine.core.compile_watch import WATCH
from mlxr.engine.core.gc_tuning import tune_gc_once
from mlxr.engine.core.in_flight import StepsInFlight
from mlxr.engine.core.lora_setup import adapter_slots, attach_core_lora, lora_stats
from mlxr.engine.core.warm_up import warm_up
from mlxr.engine.kv.block_file import Layout
from mlxr.engine.kv.cache import KVCache, kv_bytes_per_block, kv_layout_dtype, num_blocks_for_memory, resolve_kv_dtype
from mlxr.engine.kv.disk import DiskStore
from mlxr.engine.kv.events import KVEventPublisher, make_publisher
from mlxr.engine.kv.preload import preload
from mlxr.engine.kv.state import state_bytes
from mlxr.engine.kv.state_checkpoints import StateCheckpoints, num_state_checkpoints
from mlxr.engine.kv.tiers import KVTiers
from mlxr.engine.records import EngineCoreOutput, EngineCoreRequest, SchedulerOutput, TokenLogprob
from mlxr.engine.sched.block_manager import BlockManager, SwapSpace
from mlxr.engine.sched.request import Request
from mlxr.engine.sched.scheduler import Scheduler, SchedulerConfig
from mlxr.engine.sched.state_index import StateCheckpointIndex
from mlxr.engine.sched.state_prefix import StatePrefix
from mlxr.engine.spec_decode.factory import connect_hidden_states, draft_budget, jumps_forward, make_speculator
from mlxr.engine.structured.manager import StructuredOutputManager
from mlxr.engine.worker.model_runner import ModelRunner
from mlxr.engine.worker.prompt_logprobs import prompt_logprobs
from mlxr.engine.worker.lora_slots import AdapterSlots
from mlxr.errors import ContextLengthError, InvalidParameterError, OverloadedError
from mlxr.models.pooling import pool
from mlxr.types import EngineStats

log = logging.getLogger(__name__)

# PyTorch's CPU threads in a core that computes on CUDA: its host work is Python and small ops,
# and idle OpenMP workers spin on every core, starving the threads that fill grammar masks
# (H100, 16 cores: llguidance's parallel fill took 114 us a row beside 16 torch threads,
# 25 us beside 2; bench/structured_overhead.py).
CUDA_CORE_TORCH_THREADS = 1


def _drafting_rows(config: EngineConfig, parts) -> int:
    """A drafting step's decode rows at most (a draft token is a row): speculative decoding's
    or jump-forward's, within speculative_max_batch requests unless the device's measured step
    costs plan the drafts (then at any batch)."""
    drafts = config.speculative_method is not None or jumps_forward(config, parts)
    planned = drafts and draft_budget(config, parts.device) is not None
    batch = config.max_num_seqs if planned else min(config.max_num_seqs, config.speculative_max_batch)
    return batch * (1 + config.num_speculative_tokens) if drafts else 0


@dataclass(frozen=True)
class CoreParts:
    """What a loaded model gives the engine: the weights, their shape and placement, and the
    tokenizer (the frontend's, and structured output's vocabulary in the core). A frontend
    whose core runs in another process holds the args and the tokenizer alone."""

    model: torch.nn.Module
    args: ModelArgs
    dtype: torch.dtype
    device: torch.device
    tokenizer: object | None = None  # mlxr.tokenizer.tokenizer.Tokenizer: structured output's vocabulary
    model_digest: str = ""  # what the disk tier keys blocks by (the model's files and load options)
    # A runner of another kind (mlxr/distributed: rank 0 of a tensor-parallel group, which
    # announces every step to its workers); it runs without step overlap.
    make_runner: Callable[[torch.nn.Module, KVCache, torch.device], ModelRunner] | None = None
    draft: "CoreParts | None" = None  # the draft model of speculative_method "draft"
    # (name, path, bounds) -> the adapter in the model's own names (the loader maps GGUF names);
    # None: formats/lora_adapter.read_adapter, PEFT directories as they are.
    read_adapter: Callable | None = None
    # (checkpoint, args) -> the target's MTP layer's tensors by the loader's rules
    # (loader/mtp_weights.read_mtp_tensors); None: a directory's mtp.* tensors as they are.
    read_mtp: Callable | None = None


def stateful_config(config: EngineConfig, parts: CoreParts) -> EngineConfig:
    """A model with recurrent-state layers runs without what needs a state at an arbitrary
    earlier position in the host and disk tiers or captured steps but the CPU's decode graphs (a
    drafted row runs eagerly): not offered for it yet (docs/models.md). Its prefix caching resumes
    from state checkpoints and a swapped request keeps its state in one (sched/state_prefix.py).
    Rejected drafts roll its state back (worker/state_rollback.py); a draft model with such layers
    is refused."""
    if parts.draft is not None and parts.draft.args.linear_attention is not None:
        raise InvalidParameterError("speculative_draft_model", f"{parts.draft.args.model_type} keeps a recurrent "
                                                               "state: not offered as a draft model yet")
    args = parts.args
    if args.linear_attention is None:
        return config
    off = dict(kv_host_cache_gb=0.0, kv_cache_dir=None, enable_cuda_graphs=False, enable_prefill_graphs=False)
    if not config.enable_prefix_caching or config.num_state_checkpoints == 0:
        off["swap_space_gb"] = 0.0  # a swapped request's state is kept in the checkpoint pool
    changed = [k for k, v in off.items() if getattr(config, k) != v]
    if changed:
        log.info("%s keeps a recurrent state per request: %s off", args.model_type, ", ".join(changed))
    return replace(config, **off)


class EngineCore:
    def __init__(self, parts: CoreParts, config: EngineConfig = EngineConfig()) -> None:
        config = stateful_config(config, parts)
        self.parts, self.config = parts, config
        if parts.device.type == "cuda" and torch.get_num_threads() > CUDA_CORE_TORCH_THREADS:
            torch.set_num_threads(CUDA_CORE_TORCH_THREADS)
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, parts.args.head_dim)
        self.num_checkpoints = num_state_checkpoints(config, parts.args.linear_attention)
        num_blocks = config.num_kv_blocks or self._auto_num_blocks()
        self.num_blocks = num_blocks
        self.max_model_len = self._max_model_len(num_blocks)
        host_blocks = (num_blocks_for_memory(parts.args, config.block_size, parts.dtype, config.swap_space_gb,
                                             self.kv_dtype)
                       if config.swap_space_gb > 0 else 0)
        self.host_blocks = host_blocks
        self.tiers: KVTiers | None = None  # none during the warm-up: its synthetic blocks stay out
        self.kv_events: KVEventPublisher | None = None  # nor are they announced
        # The warm-up runs each chunk size it means to whole (no step target); serving measures
        # the device afresh after it (the warm-up's compiles would read as a slow device).
        self._new_scheduler(0.0 if config.warm_up else config.step_time_target_s)
        # One block past the manager's range: a scratch block for CUDA-graph padding rows.
        self.kv = KVCache(parts.args, num_blocks + 1, config.block_size, parts.dtype, parts.device, host_blocks,
                          self.kv_dtype, num_state_slots=config.max_num_seqs)
        if self.num_checkpoints:
            self.kv.checkpoints = StateCheckpoints(self.kv.state, self.num_checkpoints)
        lora_targets = attach_core_lora(parts, config)  # before any graph: they record the bases
        self.runner = (parts.make_runner or ModelRunner)(parts.model, self.kv, parts.device)
        if lora_targets is not None:
            self.runner.lora = adapter_slots(lora_targets, parts, config)
        max_blocks_per_seq = self.block_manager.blocks_for(self.max_model_len)
        max_rows = None  # a step's decode rows at most (a draft token is a row): the largest graph
        WATCH.install()  # before graph capture: it compiles most kernels, and its budget leaves them out
        if parts.device.type == "cuda" and config.enable_cuda_graphs and self.runner.can_capture_graphs:
            max_rows = min(max(config.max_num_seqs, _drafting_rows(config, parts)), config.cuda_graph_max_batch)
            self.runner.enable_cuda_graphs(
                num_blocks, max_rows, max_blocks_per_seq,
                min(config.max_num_batched_tokens, self.max_model_len) if config.enable_prefill_graphs else 0,
            )
        elif parts.device.type == "cpu" and config.enable_cpu_graphs and self.runner.can_capture_graphs:
            self.runner.enable_cpu_graphs(num_blocks, max(config.max_num_seqs, _drafting_rows(config, parts)),
                                          max_blocks_per_seq)
        # Overlap the host's work with the device's only where the device runs asynchronously.
        self.overlap = parts.device.type == "cuda" if config.overlap_steps is None else config.overlap_steps
        self.overlap = self.overlap and parts.make_runner is None
        self.in_flight = StepsInFlight(self)
        self.structured = StructuredOutputManager(parts.tokenizer, parts.args.vocab_size,
                                                  pin_masks=parts.device.type == "cuda")
        self.speculator = make_speculator(parts, config, num_blocks, max_blocks_per_seq, max_rows)
        connect_hidden_states(self.speculator, self.runner)
        self.device_bytes = self._device_bytes()
        if config.warm_up:
            warm_up(self)
        else:  # compiles are expected from an engine that skipped its warm-up: none is a miss
            WATCH.warming()
        self.tiers = self._make_tiers()
        self.block_manager.tiers = self.tiers
        self.kv_events = make_publisher(config)
        self.block_manager.events = self.kv_events
        if self.tiers is not None:
            self.tiers.events = self.kv_events
            if self.tiers.disk is not None:
                self.tiers.disk.events = self.kv_events
        if self.tiers is not None:
            preload(self.tiers, self.block_manager.adopt, int(config.kv_cache_preload * num_blocks))
        tune_gc_once()

    def _make_tiers(self) -> KVTiers | None:
        config, parts = self.config, self.parts
        if not config.enable_prefix_caching or (config.kv_host_cache_gb <= 0 and not config.kv_cache_dir):
            return None
        host = (num_blocks_for_memory(parts.args, config.block_size, parts.dtype, config.kv_host_cache_gb, self.kv_dtype)
                if config.kv_host_cache_gb > 0 else 0)
        disk = None
        if config.kv_cache_dir:
            a = parts.args
            layout = Layout(parts.model_digest, kv_layout_dtype(self.kv_dtype, parts.dtype), config.block_size,
                            a.num_hidden_layers, a.num_key_value_heads, a.head_dim, parts.device.type)
            disk = DiskStore(config.kv_cache_dir, layout, kv_bytes_per_block(a, config.block_size, parts.dtype,
                                                                             self.kv_dtype),
                             int(config.kv_cache_disk_gb * (1 << 30)))
        return KVTiers(self.kv, host, disk)

    def close(self) -> None:
        """Finish the disk tier's writes and the events' sending (the engine stops)."""
        if self.tiers is not None:
            self.tiers.close()
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None

    def _new_scheduler(self, step_time_target_s: float) -> None:
        config = self.config
        self.block_manager = BlockManager(self.num_blocks, config.block_size, config.enable_prefix_caching)
        self.block_manager.tiers = self.tiers
        self.block_manager.events = self.kv_events
        if self.kv_events is not None:
            self.kv_events.cleared()
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len, step_time_target_s,
                            config.max_loras if (config.enable_lora or config.lora_modules) else 0),
            self.block_manager,
            SwapSpace(self.host_blocks) if self.host_blocks else None,
        )
        if self.num_checkpoints:
            self.scheduler.state_prefix = StatePrefix(self.block_manager, StateCheckpointIndex(self.num_checkpoints))

    def reset(self) -> None:
        """Forget every request and cached prefix (after the warm-up's synthetic ones)."""
        self.in_flight.sample_forwarded()
        self.in_flight.land()
        self._new_scheduler(self.config.step_time_target_s)
        self.runner.reset()
        if self.speculator is not None:
            self.speculator.reset()

    def _auto_num_blocks(self) -> int:
        """The memory budget's worth of blocks, but no more than max_num_seqs full-length
        sequences can use (plus room for cached prefixes), so small models stay small."""
        config, args = self.config, self.parts.args
        gb = config.kv_cache_memory_gb
        if args.linear_attention is not None:  # the state slots and checkpoints come out of the same budget
            held = state_bytes(args.linear_attention, config.max_num_seqs)
            held += self.num_checkpoints * args.linear_attention.state_bytes_per_sequence()
            gb = max(gb / 2, gb - held / (1 << 30))
        budget = num_blocks_for_memory(args, config.block_size, self.parts.dtype, gb, self.kv_dtype)
        context = config.max_model_len or args.max_position_embeddings
        useful = 2 * config.max_num_seqs * -(-context // config.block_size)
        return min(budget, useful)

    def _max_model_len(self, num_blocks: int) -> int:
        cache_tokens = num_blocks * self.config.block_size
        limit = self.config.max_model_len or self.parts.args.max_position_embeddings
        if cache_tokens < limit:
            log.info("max_model_len %d capped to the KV cache's %d tokens", limit, cache_tokens)
        return min(limit, cache_tokens)

    # --- requests ------------------------------------------------------------------------------
    def add_request(self, request: EngineCoreRequest) -> None:
        req = Request(request)
        if request.lora_name:
            adapter = self.adapters.get(request.lora_name)
            req.lora_id, req.lora_root = adapter.lora_id, adapter.root
        if request.params.structured_outputs is None:
            self.scheduler.add(req)
        else:
            self.structured.add(req)  # joins the scheduler once its grammar has compiled

    def abort_requests(self, request_ids: list[str]) -> None:
        self.structured.abort(request_ids)
        self.scheduler.abort(request_ids)

    @property
    def fatal(self) -> str | None:
        """Why no further step can run (a tensor-parallel worker died), or None."""
        return self.runner.fatal

    def shutdown(self) -> None:
        """The engine stops: the disk tier's writes finish, tensor-parallel workers exit."""
        self.close()
        self.runner.shutdown()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished or not self.in_flight.empty or self.structured.busy

    # --- the step ------------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        """One step: schedule -> execute (queued on the device) -> land the step before it.
        Returns the outputs of every step that landed in it."""
        outputs = self._step()
        lora = self.runner.lora
        if lora is not None and len(lora.by_id) > len(lora.by_name):  # unloaded ones may be free now
            lora.forget_retired({r.lora_id for r in self.scheduler.requests.values() if r.lora_id})
        if self.kv_events is not None:
            self.kv_events.flush()
        return outputs

    def _step(self) -> list[EngineCoreOutput]:
        flight = self.in_flight
        outputs = self.structured.admit(self.scheduler, not self.scheduler.has_unfinished and flight.empty)
        if flight.forwarded and (self._may_draft() or not self.structured.live):
            outputs += flight.sample_forwarded()  # drafts may follow (their proposer needs its tokens)
        landed, draft_probs = self._speculate()
        out = self.scheduler.schedule()
        outputs += landed + flight.sample_forwarded()
        if out.is_empty:
            return outputs + self._idle(out, bool(outputs))
        return outputs + flight.execute(out, draft_probs)

    def _idle(self, out: SchedulerOutput, gave_outputs: bool) -> list[EngineCoreOutput]:
        """A step without rows: its housekeeping, and the step in flight lands. With nothing to
        hand on, a grammar still compiling is waited for (briefly) rather than spun on."""
        outputs = self._housekeeping(out)
        if self.in_flight.launched is None and not (gave_outputs or outputs):
            self.structured.wait_for_compile()
        return outputs + self.in_flight.land_and_flush()

    def fail_step(self, request_ids: list[str], e: Exception, what: str = "model step failed") -> list[EngineCoreOutput]:
        """Called in the except block of a step's failure: logs it, fails the requests with it."""
        log.exception(what)
        return self.scheduler.fail(request_ids, f"{type(e).__name__}: {e}")

    def _housekeeping(self, out: SchedulerOutput) -> list[EngineCoreOutput]:
        """A step without rows still carries its swap-outs, copies and forgotten requests to the
        runner (dropped, a preempted request's KV never reached the host)."""
        if not (out.blocks_to_swap_out or out.blocks_to_swap_in or out.blocks_to_copy
                or out.finished_request_ids or out.preempted_request_ids):
            return []
        try:
            if self.tiers is not None:
                self.tiers.flush()
            self.runner.housekeeping(out)
        except Exception as e:  # noqa: BLE001 - as a failed step: its preempted requests fail
            self.scheduler.recompute_swapped(out.preempted_request_ids)
            return self.fail_step(out.preempted_request_ids, e)
        return []

    def _may_draft(self) -> bool:
        spec, scheduler = self.speculator, self.scheduler
        return spec is not None and spec.may_draft(len(scheduler.running) + len(scheduler.waiting))

    def _speculate(self) -> tuple[list[EngineCoreOutput], dict | None]:
        """Drafts for this step's decode rows (landing the step in flight first when a proposer
        needs its tokens): the outputs that landing gave and the drafts' distributions."""
        spec = self.speculator
        if spec is None:
            return [], None
        inflight = self.in_flight.launched
        if spec.proposer is None and not self.structured.live:  # only grammars draft, and none is live
            drafted = inflight is not None and bool(inflight.spec_token_ids)
            return (self.in_flight.land() if drafted else []), None
        landed = []
        running = self.scheduler.running
        waiting = len(self.scheduler.waiting)
        if spec.needs_landed_tokens(running, inflight, waiting):
            landed = self.in_flight.land()
        spec.propose(running, waiting)
        return landed, spec.draft_probs

    # --- LoRA adapters --------------------------------------------------------------------------
    @property
    def adapters(self) -> AdapterSlots:
        if self.runner.lora is None:
            raise InvalidParameterError("model", "this engine serves no LoRA adapters (start it with --enable-lora or --lora)")
        return self.runner.lora

    def load_lora(self, name: str, path: str) -> int:
        """Load an adapter for requests that name it; its id (vLLM's lora_int_id)."""
        return self.adapters.load(name, path).lora_id

    def unload_lora(self, name: str) -> None:
        """New requests may no longer name it; those admitted keep it until they finish."""
        self.adapters.unload(name, {r.lora_id for r in self.scheduler.requests.values() if r.lora_id})

    def lora_names(self) -> list[str]:
        return [] if self.runner.lora is None else list(self.runner.lora.by_name)

    # --- between steps -------------------------------------------------------------------------
    def embed(self, token_ids: list[int]) -> list[float]:
        """The last hidden states pooled as the model's files say (Qwen3-Embedding: its last
        token), else their mean (as llama.cpp and Ollama embed with decoder models), then
        L2-normalised; computed in free KV blocks between steps."""
        with self._scratch_blocks(token_ids, "embedding") as blocks:
            hidden = self.runner.hidden_states(token_ids, blocks).float()
        mode = self.parts.args.extra.get("pooling") or "mean"
        vector = pool(hidden[None], torch.tensor([len(token_ids)], device=hidden.device), mode)[0]
        return torch.nn.functional.normalize(vector, dim=0).tolist()

    def prompt_logprobs(self, token_ids: list[int], top: int, first: int = 0) -> list[TokenLogprob]:
        """Each of token_ids[first + 1:]'s logprob given the tokens before it, its rank and the top
        `top` alternatives; computed as embeddings are (no request; its full blocks stay in
        the prefix cache, so generating from the same prompt next computes little)."""
        with self._scratch_blocks(token_ids, "prompt scoring") as blocks:
            # closed at once however scoring ends: a tensor-parallel runner's close finishes
            # the chunks its workers run in step with it
            with contextlib.closing(self.runner.prompt_logits(token_ids, blocks, first=first)) as chunks:
                return prompt_logprobs(chunks, token_ids, top, first)

    @contextlib.contextmanager
    def _scratch_blocks(self, token_ids: list[int], what: str) -> Iterator[list[int]]:
        """Free KV blocks for a prompt computed between steps, released after (its full
        blocks published to the prefix cache once computed)."""
        if len(token_ids) > self.max_model_len:
            raise ContextLengthError(len(token_ids), self.max_model_len)
        bm = self.block_manager
        need = bm.blocks_for(len(token_ids))
        if not bm.can_allocate(need):
            raise OverloadedError(f"the KV cache is busy; retry the {what} later")
        blocks = bm.take_blocks(need)
        if self.tiers is not None:
            self.tiers.flush()  # the blocks taken may have held cached prefixes to save first
        try:
            yield blocks
            bm.commit_blocks(blocks, token_ids)  # computed: its full blocks join the prefix cache
        finally:
            bm.release_blocks(blocks)
            if self.kv_events is not None:
                self.kv_events.flush()

    def stats(self) -> EngineStats:
        """The core's part of the engine's stats (the frontend adds its own counts)."""
        sch, usage = self.scheduler, self.block_manager.usage()
        spec = self.speculator.stats if self.speculator is not None else None
        return EngineStats(
            len(sch.running), len(sch.waiting), len(sch.swapped), usage.total, usage.used, usage.cached,
            sch.counters.prefix_queried_tokens, sch.counters.prefix_hit_tokens, sch.counters.num_preemptions,
            self.max_model_len, self.device_bytes, WATCH.after_warm_up,
            self.tiers.stats() if self.tiers is not None else {},
            *((spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens, tuple(spec.accepted_per_position),
               spec.forced_drafts, spec.forced_draft_tokens, spec.forced_accepted_tokens)
              if spec is not None else ()),
            vision_encoder_calls=self.runner.images.encoder_calls if getattr(self.runner, "images", None) else 0,
            **lora_stats(self.runner.lora, sch),
        )

    def _device_bytes(self) -> int:
        weights = sum(t.numel() * t.element_size() for t in self.parts.model.state_dict().values())
        cache = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv.layers)
        return weights + cache
