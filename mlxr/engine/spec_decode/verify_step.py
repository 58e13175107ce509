"""A step that carries draft tokens, sampled at once: speculative rows through the rejection
sampler, the other rows through the plain sampler. Its tokens land on the host before the next
step is scheduled (the next step's proposer needs them there), so it never leaves tokens in
flight on the device."""
from __future__ import annotations

import itertools

import torch

from mlxr.engine.records import ModelRunnerOutput, SchedulerOutput, TokenLogprob
from mlxr.engine.spec_decode.rejection import RejectionSampler
from mlxr.engine.worker.input_batch import InputBatch
from mlxr.engine.worker.sampler import LastTokens, Sampler
from mlxr.engine.worker.transfers import to_device


def sample_with_drafts(batch: InputBatch, sampler: Sampler, rejection: RejectionSampler, out: SchedulerOutput,
                       ids: list[str], logits: torch.Tensor, pending: LastTokens | None,
                       draft_probs: dict[str, torch.Tensor], masks: torch.Tensor | None = None) -> ModelRunnerOutput:
    """ids: the rows that sample, in order; logits: 1 + k rows for a speculative row, 1 else.
    masks (structured output): a packed token bitmask row per logits row (the grammar manager's
    position_bitmask). The runner's request states take the tokens in."""
    spec = out.spec_token_ids
    counts = [1 + len(spec.get(rid, ())) for rid in ids]
    starts = list(itertools.accumulate(counts, initial=0))
    states = [batch.states[rid].sampling for rid in ids]
    sampled: list[list[int]] = [[] for _ in ids]
    logprobs: list[list[TokenLogprob] | None] = [None] * len(ids)
    plain = [i for i, rid in enumerate(ids) if rid not in spec]
    if plain:
        rows = to_device([starts[i] for i in plain], torch.long, logits.device)
        last = None if pending is None else LastTokens(pending.tokens, [pending.rows[i] for i in plain])
        bitmask = None if masks is None else masks[[starts[i] for i in plain]]
        samples = sampler.launch(logits.index_select(0, rows), [states[i] for i in plain], last, bitmask).result()
        for j, i in enumerate(plain):
            sampled[i] = [samples.token_ids[j]]
            if samples.stats is not None and states[i].params.logprobs is not None:
                s = samples.stats[j]
                logprobs[i] = [TokenLogprob(s.token_id, s.logprob, s.rank, s.top_logprobs)]
    drafted = [i for i, rid in enumerate(ids) if rid in spec]
    if drafted:
        positions = [p for i in drafted for p in range(starts[i], starts[i + 1])]
        rows = to_device(positions, torch.long, logits.device)
        verdicts = rejection.verify(logits.index_select(0, rows), [ids[i] for i in drafted],
                                    [states[i] for i in drafted], [spec[ids[i]] for i in drafted],
                                    [draft_probs.get(ids[i]) for i in drafted],
                                    None if masks is None else masks[positions])
        for i, v in zip(drafted, verdicts):
            sampled[i], logprobs[i] = v.token_ids, v.logprobs
    for rid, tokens in zip(ids, sampled):
        batch.states[rid].take(tokens)
    wanted = any(s.params.logprobs is not None for s in states)
    return ModelRunnerOutput(list(ids), sampled, logprobs if wanted else None)
