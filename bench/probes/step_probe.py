"""Where a decode step's time goes on a GPU: the model alone (CUDA-graph replay timed with
CUDA events) beside the whole engine step, with steps overlapped and not, and a host-side
profile. JSON to bench/results/step_probe-*.json.

  python bench/probes/step_probe.py [--model tinyllama-shape] [--batches 1 64 256] [--quantization auto]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, print_table, time_engine_phases, write_result
from latency import bench_mlxr, model_paths, prompt_ids
from throughput import run_mlxr, workload


def replay_ms(llm, batch: int, iters: int = 50) -> float | None:
    graphs = llm.engine.core.core.runner.graphs
    if graphs is None or batch not in graphs.graphs:
        return None
    graph, _ = graphs.graphs[batch]
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def replay_kernels(llm, batch: int, iters: int = 20) -> list[dict]:
    """GPU time per decode step of each kernel in the captured graph (CUPTI traces the
    graph's kernels one by one), largest first, with the step's kernel count."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    graphs = llm.engine.core.core.runner.graphs
    if graphs is None or batch not in graphs.graphs:
        return []
    graph, _ = graphs.graphs[batch]
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            graph.replay()
        torch.cuda.synchronize()
    us, calls = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name[:60]] += e.device_time / iters
            calls[e.name[:60]] += 1
    return sorted(({"kernel": k, "us_per_step": v, "per_step": calls[k] / iters} for k, v in us.items()),
                  key=lambda r: -r["us_per_step"])


def host_profile(llm, vocab: int, gen: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    bench_mlxr(llm, "cuda", prompt_ids(vocab, 128), gen, 0)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
    return text.getvalue()


def phase_ms(llm, vocab: int, batch: int, steps: int = 40) -> dict:
    """Host milliseconds per decode step in each engine phase, with `batch` sequences running;
    "wait" is the time spent waiting for the device's tokens."""
    import time
    from collections import Counter

    from mlxr import SamplingParams
    from mlxr.engine.worker import transfers as staging

    engine, spent = llm.engine, Counter()
    unwrap = time_engine_phases(engine, spent)
    real_get = staging.HostCopy.get
    staging.HostCopy.get = lambda self: (lambda t0: (real_get(self), spent.update(wait=time.perf_counter() - t0))[0])(
        time.perf_counter())
    try:
        for i, (ids, n) in enumerate(workload(vocab, batch, 128, 64, False)):
            engine.add_request(f"ph-{i}", ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), stream_deltas=True)
        sch = engine.core.core.scheduler
        while sch.waiting or any(s.num_uncomputed_tokens > 1 for s in sch.running):  # until all decode
            engine.step()
        for _ in range(2):
            engine.step()
        spent.clear()
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        total, timed_spent = time.perf_counter() - t0, dict(spent)
        while engine.has_unfinished():
            engine.step()
    finally:
        staging.HostCopy.get = real_get
        unwrap()  # the classes' methods again
    out = {k: 1e3 * v / steps for k, v in timed_spent.items()}
    out["step"] = 1e3 * total / steps
    return out


def batch_profile(llm, vocab: int, batch: int, steps: int = 30) -> str:
    """cProfile of decode steps with `batch` sequences running."""
    from mlxr import SamplingParams

    engine = llm.engine
    for i, (ids, n) in enumerate(workload(vocab, batch, 128, 64, False)):
        engine.add_request(f"prof-{i}", ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), stream_deltas=True)
    for _ in range(4):
        engine.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    while engine.has_unfinished():
        engine.step()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    return text.getvalue()


def prefill_profile(llm, vocab: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    ids = prompt_ids(vocab, 512)
    bench_mlxr(llm, "cuda", ids, 2, 0)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        bench_mlxr(llm, "cuda", ids, 2, 0)
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=18)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tinyllama-shape")
    p.add_argument("--quantization", default=None)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--no-profiles", action="store_true")
    a = p.parse_args()
    from mlxr import LLM

    ref = a.model if a.model.endswith(".gguf") else model_paths(a.model)[0]
    rows, profiles, phases = [], {}, {}
    for overlap in (True, False):
        llm = LLM(ref, dtype=torch.bfloat16, engine_process=False, device="cuda", quantization=a.quantization, max_num_seqs=max(a.batches),
                  max_num_batched_tokens=8192, kv_cache_memory_gb=8, overlap_steps=overlap)
        vocab = llm.args.vocab_size
        run_mlxr(llm, workload(vocab, 2, 16, 4, False), "cuda")  # warm-up
        single = bench_mlxr(llm, "cuda", prompt_ids(vocab, 128), 256, 2)
        prefill = bench_mlxr(llm, "cuda", prompt_ids(vocab, 512), 2, 2)
        row = {"overlap": overlap, "decode_1_tok_s": single["decode_tok_s"], "prefill_512_tok_s": prefill["prefill_tok_s"]}
        for b in a.batches:
            if b > 1:
                row[f"batch_{b}_tok_s"] = run_mlxr(llm, workload(vocab, b, 128, 128, False), "cuda")["decode_tok_s"]
            row[f"replay_{b}_ms"] = replay_ms(llm, b)
        rows.append(row)
        for b in a.batches:
            phases[f"overlap={overlap} batch={b}"] = phase_ms(llm, vocab, b)
        if overlap:
            for b in a.batches:
                profiles[f"graph_kernels_batch_{b}"] = kernels = replay_kernels(llm, b)
                print(f"--- graph kernels, batch {b}: {sum(r['per_step'] for r in kernels):.0f} a step, "
                      f"{sum(r['us_per_step'] for r in kernels):.0f} us busy")
                print_table(kernels[:25], ["kernel", "us_per_step", "per_step"])
        if overlap and not a.no_profiles:
            profiles["host_single_stream"] = host_profile(llm, vocab, 128)
            profiles["prefill_512"] = prefill_profile(llm, vocab)
            profiles[f"host_batch_{max(a.batches)}"] = batch_profile(llm, vocab, max(a.batches))
        del llm
        torch.cuda.empty_cache()
    for name, text in profiles.items():
        if isinstance(text, str):
            print(f"--- {name}\n{text}")
    for name, ms in phases.items():
        print(name, " ".join(f"{k} {v:.2f}" for k, v in ms.items()))
    path = write_result("step_probe", {"model": a.model, "quantization": a.quantization, "dtype": "bfloat16",
                                       "device": device_name("cuda"), "results": rows, "phases_ms": phases, "profiles": profiles})
    print_table(rows, list(rows[0]))
    print(path)


if __name__ == "__main__":
    main()
