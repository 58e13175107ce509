"""`mlxr bench`: single-stream or batched generation timing, with --profile for a per-op
breakdown of GPU (or CPU) time per step. Writes JSON when --json is given."""
from __future__ import annotations

import argparse
import json
import os
import time

from mlxr.cli.options import add_model_options, use_threads


def register(sub) -> dict:
    p = sub.add_parser("bench", help="time prefill and decode; --profile shows time per op")
    add_model_options(p, positional=False)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="per-op time per step (runs eagerly)")
    p.add_argument("--json", default=None, help="write the figures to this file")
    return {"bench": cmd_bench}


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def cmd_bench(ns: argparse.Namespace) -> int:
    import torch

    from mlxr.llm import LLM
    from mlxr.profiler import OpProfiler
    from mlxr.types import SamplingParams

    use_threads(ns)
    threads = torch.get_num_threads()  # what torch runs with, not only what was asked
    llm = LLM(ns.model, dtype=ns.dtype, device=ns.device, quantization=ns.quantization,
              enable_cuda_graphs=not ns.profile, enable_cpu_graphs=not ns.profile,  # a profile times eager ops
              engine_process=False,  # the profiler and the figures read the model in this process
              max_num_seqs=max(ns.batch, 1), max_num_batched_tokens=max(2048, ns.prompt_len))
    g = torch.Generator().manual_seed(0)
    vocab = llm.loaded.args.vocab_size
    prompts = [torch.randint(10, vocab - 10, (ns.prompt_len,), generator=g).tolist() for _ in range(ns.batch)]
    params = SamplingParams(max_tokens=ns.gen_len, temperature=0, ignore_eos=True)
    # Warm-up at the timed run's shapes, so that no kernel compiles inside it (rotated
    # prompts: the timed run must not hit the prefix cache).
    _timed_run(llm, [p[1:] + p[:1] for p in prompts], params)
    prof = OpProfiler(llm.loaded.model) if ns.profile else None
    figures = _timed_run(llm, prompts, params, on_first_token=prof.reset if prof else None)
    print(f"{ns.model} on {llm.loaded.device} ({llm.loaded.dtype}, weights {llm.loaded.weight_dtype}, "
          f"quantization {llm.loaded.quantization}), "
          f"{threads} threads, batch {ns.batch}, prompt {ns.prompt_len}, gen {ns.gen_len}")
    print(f"prefill {figures['prefill_tok_s']:,.1f} tok/s   decode {figures['decode_tok_s']:,.1f} tok/s   "
          f"steps {figures['steps']}")
    if prof is not None:
        # Per forward pass: with overlapped steps the step counts and the passes differ by one.
        figures["profiled_forwards"] = prof.forwards
        figures["profile"] = _print_profile(prof, max(1, prof.forwards))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"model": ns.model, "threads": threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                       "batch": ns.batch, "prompt_len": ns.prompt_len,
                       "gen_len": ns.gen_len, **figures}, f, indent=2)
    return 0


def _timed_run(llm, prompts, params, on_first_token=None) -> dict:
    """Prefill and decode tok/s; steps counts the decode steps (after every first token)."""
    engine, device = llm.engine, llm.loaded.device
    for i, p in enumerate(prompts):
        engine.add_request(f"bench-{i}", p, params, stream_deltas=True)
    t0 = time.perf_counter()
    first, generated, steps, started = None, 0, 0, set()
    while engine.has_unfinished():
        outs = engine.step()
        steps += 1
        for o in outs:
            if o.outputs[0].token_ids:
                generated += len(o.outputs[0].token_ids)
                started.add(o.request_id)
        if first is None and len(started) == len(prompts):  # every prompt has its first token
            _sync(device)
            first, at_first, steps = time.perf_counter(), generated, 0
            if on_first_token is not None:
                on_first_token()
    _sync(device)
    t1 = time.perf_counter()
    return {"prefill_tok_s": sum(map(len, prompts)) / (first - t0),
            "decode_tok_s": (generated - at_first) / max(1e-9, t1 - first), "steps": steps}


def _print_profile(prof, forwards: int) -> list[dict]:
    rows = [{"op": t.op, "calls": t.calls, "ms_per_step": t.total_ms / forwards} for t in prof.breakdown()]
    total = sum(r["ms_per_step"] for r in rows) or 1.0
    print(f"{'op':<20} {'calls':>7} {'ms/step':>9} {'share':>7}   (per forward pass, decode only)")
    for r in rows:
        print(f"{r['op']:<20} {r['calls']:>7} {r['ms_per_step']:>9.3f} {100 * r['ms_per_step'] / total:>6.1f}%")
    return rows
