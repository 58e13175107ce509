"""Runs a SchedulerOutput: builds the inputs (input_batch.py), runs the model (eagerly or by
CUDA graph replay), samples, and hands back a RunnerStep whose ModelRunnerOutput is read when
the host needs it, so the host can prepare the next step while the device runs this one."""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterator
from typing import Callable

import torch
from torch import nn

from mlxr.engine.kv.cache import KVCache
from mlxr.engine.records import ModelRunnerOutput, SchedulerOutput, TokenLogprob
from mlxr.engine.spec_decode.rejection import RejectionSampler
from mlxr.engine.spec_decode.verify_step import sample_with_drafts
from mlxr.engine.worker.image_embeddings import StepImages
from mlxr.engine.worker.input_batch import InputBatch, PendingTokens, StepInputs, slots_for
from mlxr.engine.worker.lora_step import adapter_slots_update, lora_step
from mlxr.engine.worker.lora_slots import AdapterSlots
from mlxr.engine.worker.metadata import pack_step
from mlxr.engine.worker.prompt_logprobs import logit_chunks
from mlxr.engine.worker.sampler import LastTokens, SampleFuture, Sampler
from mlxr.engine.worker.state_rollback import StateSnapshot
from mlxr.engine.worker.steady_decode import DecodeArrays
from mlxr.engine.worker.transfers import to_device
from mlxr.ops.backend import use_triton


# (sampling request ids) -> a packed int32 bitmask [rows, ceil(vocab / 32)] on the host, a
# callable that waits for one still being filled (structured output's PendingMask), or None
# (sampling request ids, the step's drafts by request) -> the packed token bitmask: a row per
# sampling row, or in a drafting step a row per sampled position (structured output), or None.
BeforeSample = Callable[[list[str], dict], "torch.Tensor | Callable[[], torch.Tensor] | None"]


@dataclass
class Forwarded:
    """A step whose forward is queued and whose sampling is not yet."""

    request_ids: list[str]  # the rows that sample
    logits: torch.Tensor | None
    pending: PendingTokens | None  # the previous step's tokens, on the device only at the forward


class RunnerStep:
    """A launched step: its sampled tokens are on the device at once, on the host at result()."""

    def __init__(self, batch: InputBatch, request_ids: list[str], future: SampleFuture | None,
                 output: ModelRunnerOutput | None = None) -> None:
        self.batch, self.request_ids, self.future = batch, request_ids, future
        self._output = output  # given at once by a step that verified drafts

    @property
    def in_flight(self) -> bool:
        """Its sampled tokens are on the device only: the next step reads them there."""
        return self.future is not None and self._output is None

    def result(self) -> ModelRunnerOutput:
        """Wait for the sampled ids; the runner's own request states take them in."""
        if self._output is not None:
            return self._output
        if self.future is None:
            self._output = ModelRunnerOutput([], [], None)
            return self._output
        samples = self.future.result()
        states = self.batch.states
        sampled = [[t] for t in samples.token_ids]
        for rid, tokens in zip(self.request_ids, sampled):
            state = states.get(rid)
            if state is not None:  # else finished or preempted since: the runner forgot it
                state.take(tokens)
        logprobs = None
        if samples.stats is not None:
            logprobs = [[TokenLogprob(s.token_id, s.logprob, s.rank, s.top_logprobs)] for s in samples.stats]
        self._output = ModelRunnerOutput(self.request_ids, sampled, logprobs)
        return self._output


class ModelRunner:
    fatal: str | None = None  # set by a runner that can run no further step (mlxr/distributed)
    can_capture_graphs = True  # False: a runner whose steps are not captured (see mlxr/distributed)

    def __init__(self, model: nn.Module, kv_cache: KVCache, device: torch.device) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.batch = InputBatch(kv_cache.block_size, device, kv_cache.state)
        self.sampler = Sampler()
        self.rejection = RejectionSampler(self.sampler)
        self.graphs = None  # DecodeGraphs, set by enable_cuda_graphs on CUDA (enable_cpu_graphs on the CPU)
        self.prefill_graphs = None  # PrefillGraphs, likewise
        self._last: RunnerStep | None = None  # the step launched last (its tokens feed the next)
        self.images = None  # ImageEmbeddings of a vision-language model (set_up_images)
        self.mrope = None  # MRopePositions of a model with M-RoPE (Qwen2.5-VL), likewise
        self.lora: AdapterSlots | None = None  # LoRA adapters (set by an engine that serves them)
        # A head proposer's HiddenTap (spec_decode/heads.py): its steps run eagerly and hand it
        # their hidden states; None (no such proposer) costs nothing.
        self.hidden_tap = None
        if getattr(getattr(model, "args", None), "vision", None) is not None:
            self.set_up_images()

    def set_up_images(self) -> None:
        from mlxr.engine.worker.image_embeddings import ImageEmbeddings

        tower = getattr(self.model, "multi_modal_projector", None) or self.model.visual
        self.images = ImageEmbeddings(self.model, self.device, next(tower.parameters()).dtype)
        vision = self.model.args.vision
        if vision.mrope_section:
            from mlxr.engine.worker.mrope_positions import MRopePositions

            self.mrope = MRopePositions(vision.patch_size * vision.scale_factor, self.device)

    def enable_cuda_graphs(self, scratch_block: int, max_batch: int, max_blocks_per_seq: int,
                           max_prefill_tokens: int = 0, capture_budget_s: float | None = None) -> None:
        """capture_budget_s: None, each kind's own time budget; ranks of a tensor-parallel group
        pass infinity, so that every rank captures the same graphs."""
        from mlxr.engine.worker.cuda_graphs import DecodeGraphs
        from mlxr.engine.worker.prefill_graphs import PrefillGraphs

        budget = {} if capture_budget_s is None else {"capture_budget_s": capture_budget_s}
        lora = {} if self.lora is None else {"lora_step": self.lora.targets.step}
        self.graphs = DecodeGraphs(self.model, self.kv_cache, scratch_block, max_batch, max_blocks_per_seq,
                                   **budget, **lora)
        # Prefill graphs bake in the Triton kernels' launch grids; the reference ops read host lengths.
        if max_prefill_tokens and use_triton(self.kv_cache.layers[0][0]):
            self.prefill_graphs = PrefillGraphs(self.model, self.kv_cache, scratch_block, max_prefill_tokens,
                                                max_blocks_per_seq, self.graphs.pool, **budget)

    def enable_cpu_graphs(self, scratch_block: int, max_batch: int, max_blocks_per_seq: int) -> None:
        from mlxr.engine.worker.cpu_graphs import cpu_decode_graphs

        self.graphs = cpu_decode_graphs(self.model, self.kv_cache, scratch_block, max_batch, max_blocks_per_seq)

    def shutdown(self) -> None:
        """Release what the runner started besides the model (a tensor-parallel group's workers)."""

    def reset(self) -> None:
        """Forget every request (the engine core starts over)."""
        self.batch = InputBatch(self.kv_cache.block_size, self.device, self.kv_cache.state)
        self._last = None

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, before_sample: BeforeSample | None = None,
                draft_probs: dict[str, torch.Tensor] | None = None) -> RunnerStep:
        """Queue one step (forward and sampling) on the device; returns before it has run
        (unless it verifies draft tokens: then its tokens are on the host on return).
        before_sample(sampling ids, drafts), when given, runs once the forward is queued and may
        land the previous step; it returns the rows' packed token bitmask (structured output; in
        a drafting step a row per sampled position) or None. draft_probs: each drafted row's
        draft distributions (none for certain drafts)."""
        # Drafted rows are decode rows of requests the runner knows: their slots are taken already.
        snapshot = StateSnapshot(self.kv_cache, out) if out.spec_token_ids and self.kv_cache.state is not None else None
        fwd = self.forward(out)
        ids = fwd.request_ids
        if out.spec_token_ids and ids:
            masks = before_sample(ids, out.spec_token_ids) if before_sample is not None else None
            output = sample_with_drafts(self.batch, self.sampler, self.rejection, out, ids, fwd.logits,
                                        self._pending_for(ids, fwd.pending), draft_probs or {}, masks)
            if snapshot is not None:
                snapshot.roll_back(self.model, self.kv_cache, self.batch, output)
            self._last = step = RunnerStep(self.batch, ids, None, output)
            return step
        bitmask = before_sample(ids, {}) if before_sample is not None and ids else None
        return self.sample(fwd, bitmask)

    @torch.inference_mode()
    def forward(self, out: SchedulerOutput) -> Forwarded:
        """Queue a step's forward alone; sample() queues its sampling later (the engine core
        does so for a constrained step, once the previous step's tokens reached the matchers)."""
        ids, logits, pending = self._forward_step(out)
        return Forwarded(ids, logits, pending)

    @torch.inference_mode()
    def sample(self, fwd: Forwarded, bitmask=None) -> RunnerStep:
        """Queue the sampling of a forwarded step (no other forward in between: graph logits
        live until the next replay) under the rows' packed token bitmask, if any (as
        BeforeSample gives it)."""
        future = None
        if fwd.request_ids:
            states = [self.batch.states[rid].sampling for rid in fwd.request_ids]
            # The previous step landed since the forward (or the mask's hook landed it): the
            # states hold its tokens now, not the device only.
            pending = fwd.pending if self._last is not None and self._last.in_flight else None
            future = self.sampler.launch(fwd.logits, states, self._pending_for(fwd.request_ids, pending), bitmask)
        self._last = step = RunnerStep(self.batch, fwd.request_ids, future)
        return step

    @torch.inference_mode()
    def logits(self, out: SchedulerOutput) -> tuple[list[str], torch.Tensor | None]:
        """A step's forward alone: the request ids whose rows reached their last token and
        their float32 logits (tests and probes compare these with references)."""
        ids, logits, _ = self._forward_step(out)
        return ids, logits

    def housekeeping(self, out: SchedulerOutput) -> None:
        """A step with no rows (overlapped, one can hold only a swap-out: the requests left
        running have their last token in flight): its request changes and block copies, queued
        after the step in flight, with no forward; that step stays the one whose tokens the
        next step reads."""
        self._apply(out)

    def _apply(self, out: SchedulerOutput) -> None:
        if out.state_swap_outs:  # swapped-out hybrid rows: their states kept before their slots go
            slot_of = self.kv_cache.state.slot_of
            self.kv_cache.checkpoints.save([(slot_of[rid], c) for rid, c in out.state_swap_outs])
        if self.lora is None:
            self.batch.update(out)
        else:
            adapter_slots_update(self.lora, self.batch, out)
        if self.images is not None:
            self.images.update(out)
        if self.mrope is not None:
            self.mrope.update(out)
        self.kv_cache.swap_out(out.blocks_to_swap_out)
        self.kv_cache.swap_in(out.blocks_to_swap_in)
        self.kv_cache.copy_blocks(out.blocks_to_copy)
        if out.state_restores:  # prefix hits of hybrid models resume from a kept state
            slot_of = self.kv_cache.state.slot_of
            self.kv_cache.checkpoints.restore([(c, slot_of[rid]) for rid, c in out.state_restores])

    def _forward_step(self, out: SchedulerOutput) -> tuple[list[str], torch.Tensor | None, PendingTokens | None]:
        self._apply(out)
        last = self._last
        pending = None
        if last is not None and last.in_flight:
            pending = PendingTokens(last.future.tokens, {rid: i for i, rid in enumerate(last.request_ids)})
        ids, logits = self._forward(out, pending)
        if out.state_saves:  # rows that ended at a prompt's checkpointed boundary keep their state
            slot_of = self.kv_cache.state.slot_of
            self.kv_cache.checkpoints.save([(slot_of[rid], c) for rid, c in out.state_saves])
        return ids, logits, pending

    def _pending_for(self, ids: list[str], pending: PendingTokens | None) -> LastTokens | None:
        """Where each sampling row's in-flight token sits in the previous step's samples:
        penalties and min_tokens count it as an output."""
        if pending is None:
            return None
        rows = pending.rows
        return LastTokens(pending.tokens, [rows.get(rid) for rid in ids])

    def _forward(self, out: SchedulerOutput, pending: PendingTokens | None) -> tuple[list[str], torch.Tensor | None]:
        """The request ids that sample and their float32 logits [S, vocab]. After a CUDA graph
        replay the logits may be a view of the graph's static output, valid until the next step."""
        if not out.request_ids:  # housekeeping alone (a tensor-parallel worker's copy of one)
            return [], None
        if self.lora is not None:
            with lora_step(self.lora.targets.step, self.batch, out, self.device) as adapters:
                # Some row runs an adapter: the decode CUDA graphs hold the adapters' products (their
                # rows' slots go to the graphs' buffer); CPU and prefill graphs do not.
                in_graphs = getattr(self.graphs, "lora_slots", None) is not None
                if adapters and (not in_graphs or self._prefill_graph_fits(out)):
                    return self._run_inputs(self.batch.build(out, pending, False, None), graphs=False)
                return self._forward_base(out, pending)
        return self._forward_base(out, pending)

    def _forward_base(self, out: SchedulerOutput, pending: PendingTokens | None) -> tuple[list[str], torch.Tensor | None]:
        mrope = self.mrope is not None and self.mrope.needed(out)
        if self.images is not None and self.images.needed(out):
            step = self.images.for_step(out)
            if step is not None or mrope:
                return self._run_with_images(out, pending, step)
        elif mrope:  # decode after an image: its positions carry the rope delta
            return self._run_with_images(out, pending, None)
        if self.hidden_tap is not None:
            return self._run_tapped(out, pending)
        if self._prefill_graph_fits(out):
            rid, start, n = out.request_ids[0], out.num_computed_tokens[0], out.num_scheduled_tokens[0]
            state = self.batch.states[rid]
            logits = self.prefill_graphs.run(state.token_ids[start: start + n], start, state.block_table)
            self.batch.steady.forget()
            return ([rid], logits.float()) if start + n == len(state.token_ids) else ([], None)
        graph_fits = self.graphs.fits if self.graphs is not None else None
        inputs = self.batch.build(out, pending, self.graphs is not None, graph_fits)
        if isinstance(inputs, DecodeArrays):
            return list(inputs.request_ids), self.graphs.run_steady(inputs, pending.tokens)
        return self._run_inputs(inputs)

    def _run_inputs(self, inputs: StepInputs, graphs: bool = True) -> tuple[list[str], torch.Tensor | None]:
        every_row_samples = len(inputs.logit_rows) == inputs.meta.num_seqs
        if graphs and self.graphs is not None and every_row_samples and self.graphs.can_run(inputs.meta):
            # Every decode row (a speculative row's tokens are rows too) samples, in order, so
            # the graph's logits are the answer.
            return inputs.sampling_ids, self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.model_layers, inputs.meta)
        if not inputs.sampling_ids:
            return [], None
        rows = to_device(inputs.logit_rows, torch.long, hidden.device)
        return inputs.sampling_ids, self.model.compute_logits(hidden.index_select(0, rows)).float()

    def _run_tapped(self, out: SchedulerOutput, pending: PendingTokens | None) -> tuple[list[str], torch.Tensor | None]:
        """A step whose hidden states a head proposer takes: eager (graphs return logits only)."""
        inputs = self.batch.build(out, pending, False, None)
        hidden = self.hidden_tap.forward(self.model, inputs.input_ids, inputs.positions, self.kv_cache.model_layers,
                                         inputs.meta)
        self.hidden_tap.hand_over(out, hidden)
        if not inputs.sampling_ids:
            return [], None
        rows = to_device(inputs.logit_rows, torch.long, hidden.device)
        return inputs.sampling_ids, self.model.compute_logits(hidden.index_select(0, rows)).float()

    def _run_with_images(self, out: SchedulerOutput, pending: PendingTokens | None,
                         step: StepImages | None) -> tuple[list[str], torch.Tensor | None]:
        """A step whose rows hold image tokens: eager, with the tower's embeddings spliced into
        the token embeddings at their rows (and the images' spans bidirectional where the model
        says so); or (step None) rows of a request with images whose M-RoPE positions differ
        from the plain ones."""
        self.batch.steady.forget()
        inputs = self.batch.build(out, pending, False, None)
        embeds = None
        if step is not None:
            embeds = self.model.embed(inputs.input_ids)
            embeds.index_copy_(0, step.rows, step.embeddings.to(embeds.dtype))
            if self.images.bidirectional:
                inputs.meta.bidirectional = step.spans
        if self.mrope is not None:
            inputs.meta.rope_positions = self.mrope.for_step(out, inputs.meta.query_lens_list)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.model_layers, inputs.meta, embeds)
        if not inputs.sampling_ids:
            return [], None
        rows = to_device(inputs.logit_rows, torch.long, hidden.device)
        return inputs.sampling_ids, self.model.compute_logits(hidden.index_select(0, rows)).float()

    def _prefill_graph_fits(self, out: SchedulerOutput) -> bool:
        """One request's prompt chunk, all of it known on the host, that a captured bucket holds."""
        if self.prefill_graphs is None or len(out.request_ids) != 1:
            return False
        state = self.batch.states[out.request_ids[0]]
        start, n = out.num_computed_tokens[0], out.num_scheduled_tokens[0]
        return (n > 1 and start + n <= len(state.token_ids)
                and self.prefill_graphs.bucket(n, len(state.block_table)) is not None)

    @torch.inference_mode()
    def hidden_states(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        """Final hidden states [T, hidden] of token_ids in one prefill into the given blocks
        (embeddings); leaves the runner's requests alone."""
        return self._hidden(token_ids, block_table)

    @torch.inference_mode()
    def prompt_logits(self, token_ids: list[int], block_table: list[int],
                      rows: int | None = None, first: int = 0) -> Iterator[torch.Tensor]:
        """float32 logits of token_ids' positions from `first` to the one before the last, `rows`
        positions at a time (prompt logprobs; prompt_logprobs.logit_chunks); computed as
        hidden_states are."""
        hidden = self._hidden(token_ids, block_table)
        yield from logit_chunks(hidden, self.model.compute_logits, rows, first)

    def _hidden(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        bs, n = self.kv_cache.block_size, len(token_ids)
        step = pack_step(token_ids, list(range(n)), slots_for(block_table, 0, n, bs), [n], [n], block_table,
                         len(block_table), [], bs, self.device)
        if self.kv_cache.state is not None:  # one prefill from a fresh state: the scratch slot
            step.meta.state_slots = torch.tensor([self.kv_cache.state.scratch], device=self.device)
        return self.model(step.input_ids, step.positions, self.kv_cache.model_layers, step.meta)
