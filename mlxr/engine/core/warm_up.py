"""The engine core's warm-up: synthetic requests through the real scheduler and runner, in the
shapes serving will meet (prefill chunks of each graph bucket and between them, decode batches
with a prefill arriving, sampled rows with logprobs and penalties), so every kernel variant
compiles and every graph is used before the first user request. Then the core starts over."""
from __future__ import annotations

import logging
import os
import random
import time

from mlxr.engine.core.compile_watch import WATCH
from mlxr.engine.records import EngineCoreRequest
from mlxr.types import SamplingParams

log = logging.getLogger(__name__)

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=3, temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=1, logprobs=5,
                         repetition_penalty=1.1, presence_penalty=0.1, frequency_penalty=0.1, ignore_eos=True,
                         logit_bias={1: 1.0}, min_tokens=1)


def waves(core) -> list[list[tuple[int, SamplingParams]]]:
    """Requests to run together, wave after wave: (prompt length, params)."""
    room = core.max_model_len - 4
    if core.parts.device.type != "cuda":
        return [[(min(5, room), GREEDY), (min(3, room), SAMPLED)]]
    chunk = min(core.config.max_num_batched_tokens, room)
    singles = sorted({n for n in (1, 2, 15, 17, 63, 64, 65, 100, 128, 255, 256, 300, 512, 700, 1024, 1500, 2048, chunk)
                      if n <= room})
    batch = min(core.config.max_num_seqs, 64)
    seqs = min(core.config.max_num_seqs, 16)
    # Triton specialises integer arguments on being 1 or a multiple of 16: prefill batches of
    # several requests (run eagerly) with token and request counts on either side of that.
    mixed = [[(min(n, room), GREEDY)] * k for n, k in ((16, seqs), (128, 8), (33, 3), (2, seqs - 1))]
    # A prefill of 33..63 requests at once: the vocabulary projection's logits rows take the
    # Triton batch product (ops/linear/gemm_rows_triton.py) with a row count off the multiples of 16.
    many = min(core.config.max_num_seqs, 33)
    return [
        *[[(n, GREEDY)] for n in singles],
        *mixed,
        [(2, GREEDY)] * (seqs - 1) + [(3, GREEDY)],
        [(1, GREEDY)] * many,
        [(min(20 + i, room), GREEDY if i % 4 else SAMPLED) for i in range(batch)],  # decode batches, mixed steps
        [(min(n, room), GREEDY) for n in (5, 900, 7, 333, 1)],
    ]


def prefix_hit_prompts(core, rng: random.Random) -> list[list[int]]:
    """A prompt, then the same prompt and a question: the second prefills a short chunk at a
    nonzero start over a long cached context, as the first request after a restart (or after a
    shared system prompt) does. On CUDA only, like the bucket waves: without it that request
    paid ~15 ms of first-use costs on an H100 (bench/kv_tiers.py, unprimed against primed)."""
    room = core.max_model_len - 40
    if core.parts.device.type != "cuda" or not core.config.enable_prefix_caching or room < 64:
        return []
    prefix = [rng.randrange(core.parts.args.vocab_size) for _ in range(min(room, 1024))]
    return [prefix, prefix + [rng.randrange(core.parts.args.vocab_size) for _ in range(29)]]


def run_to_end(core) -> int:
    """Step until every request finished; the number of steps."""
    steps = 0
    while core.has_unfinished():
        core.step()
        steps += 1
    return steps


def warm_structured_mask(core) -> None:
    """Structured output's mask kernel, compiled once here rather than on the first constrained
    step (one variant serves every shape: ops/sampling/bitmask_triton.py). No grammar is needed for it."""
    if core.parts.device.type != "cuda":
        return
    import torch

    from mlxr.ops.sampling.sampling import apply_token_bitmask_

    vocab = core.parts.args.vocab_size
    logits = torch.zeros(1, vocab, dtype=torch.float32, device=core.parts.device)
    apply_token_bitmask_(logits, torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32, device=logits.device))


def warm_up(core) -> None:
    WATCH.install()
    WATCH.warming()
    t0 = time.perf_counter()
    budget = core.config.warm_up_budget_s
    rng = random.Random(0)
    vocab = core.parts.args.vocab_size
    steps = requests = 0
    plan = waves(core)
    t_log = t0
    for w, wave in enumerate(plan):
        if time.perf_counter() - t0 > budget:
            log.warning("warm-up stopped at its %.0fs budget after %d waves", budget, w)
            break
        if time.perf_counter() - t_log > 2.0:  # progress, not silence, while kernels compile
            log.info("warming up: wave %d of %d, %.1fs so far, %d kernels compiled", w + 1, len(plan),
                     time.perf_counter() - t0, WATCH.total)
            t_log = time.perf_counter()
        for n, params in wave:
            ids = [rng.randrange(vocab) for _ in range(n)]
            core.add_request(EngineCoreRequest(f"warm-up-{requests}", ids, params, params.max_tokens, [], time.monotonic()))
            requests += 1
        steps += run_to_end(core)
    for ids in prefix_hit_prompts(core, rng):  # one after the other: the second finds the first's blocks
        core.add_request(EngineCoreRequest(f"warm-up-{requests}", ids, GREEDY, GREEDY.max_tokens, [], time.monotonic()))
        requests += 1
        steps += run_to_end(core)
    warm_structured_mask(core)
    core.reset()
    WATCH.mark_warm()
    log.info("warm-up: %d requests, %d steps in %.1fs; %d kernels compiled (%.1fs compiling) into %s",
             requests, steps, time.perf_counter() - t0, WATCH.total, WATCH.seconds,
             os.environ.get("TRITON_CACHE_DIR", "Triton's default cache"))
