"""Offline throughput: B requests (fixed or mixed lengths) submitted at once, MLXR beside
HF transformers' batched generate on the same weights. JSON to bench/results/throughput-*.json.

  python bench/throughput.py --model tiny-llama --batch 1 8 64 --prompt-len 128 --gen-len 128
  python bench/throughput.py --model gemma3-270m --batch 8 --mixed
"""
from __future__ import annotations

import argparse
import time

import torch

from common import device_name, dtype_label, median, print_table, sync, write_result
from latency import model_paths


def workload(vocab: int, batch: int, prompt_len: int, gen_len: int, mixed: bool, seed: int = 0):
    """(prompt ids, generation length) per request; mixed draws both uniformly around the means."""
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for _ in range(batch):
        p = int(torch.randint(prompt_len // 4, prompt_len * 7 // 4 + 1, (1,), generator=g)) if mixed else prompt_len
        n = int(torch.randint(gen_len // 4, gen_len * 7 // 4 + 1, (1,), generator=g)) if mixed else gen_len
        reqs.append((torch.randint(10, vocab - 10, (p,), generator=g).tolist(), n))
    return reqs


def run_mlxr(llm, reqs, device: str) -> dict:
    from mlxr import SamplingParams

    engine = llm.engine
    for i, (ids, n) in enumerate(reqs):
        engine.add_request(f"tp-{i}", ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), stream_deltas=True)
    started: set[str] = set()
    step_times, generated = [], 0
    sync(device)
    t0 = time.perf_counter()
    all_started = None
    while engine.has_unfinished():
        s0 = time.perf_counter()
        outs = engine.step()  # no sync here: on CUDA the engine keeps the next step queued
        step_times.append(time.perf_counter() - s0)
        for out in outs:
            k = len(out.outputs[0].token_ids) if out.outputs else 0
            generated += k
            if k:
                started.add(out.request_id)
        if all_started is None and len(started) == len(reqs):
            all_started, gen_at_start, decode_from = time.perf_counter(), generated, len(step_times)
    sync(device)
    t1 = time.perf_counter()
    decode_tokens = generated - gen_at_start
    decode_steps = sorted(step_times[decode_from:])
    return {
        "total_s": t1 - t0,
        "gen_tok_s": generated / (t1 - t0),
        "decode_tok_s": decode_tokens / max(1e-9, t1 - all_started),
        "step_ms_median": 1000 * median(step_times),
        "steps": len(step_times),
        # The decode phase's step times: a long tail (host pauses) shows against the median.
        "decode_step_ms_p50": 1000 * median(decode_steps),
        "decode_step_ms_p90": 1000 * decode_steps[int(0.9 * (len(decode_steps) - 1))] if decode_steps else None,
        "decode_step_ms_sum_over_3x_median": 1000 * sum(t for t in decode_steps if t > 3 * median(decode_steps)),
    }


def run_hf(model, reqs, device: str) -> dict:
    """Batched generate with left padding; decode time = generate time - one batched prefill."""
    width = max(len(ids) for ids, _ in reqs)
    ids = torch.zeros(len(reqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(reqs):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    gen = max(n for _, n in reqs)
    with torch.inference_mode():
        sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids, attention_mask=mask)
        sync(device)
        t1 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen, min_new_tokens=gen, do_sample=False, pad_token_id=0)
        sync(device)
        t2 = time.perf_counter()
    useful = sum(n for _, n in reqs)  # HF runs every row to the longest length; count useful tokens
    return {"total_s": t2 - t1, "gen_tok_s": useful / (t2 - t1),
            "decode_tok_s": (useful - len(reqs)) / max(1e-9, (t2 - t1) - (t1 - t0))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: MLXR's device default; HF gets float32 on CPU")
    p.add_argument("--weight-dtype", default=None)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--mixed", action="store_true")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--kv-cache-gb", type=float, default=2.0)
    a = p.parse_args()
    dtype = getattr(torch, a.dtype) if a.dtype else None
    hf_dtype = dtype or (torch.float32 if a.device == "cpu" else torch.bfloat16)
    ref, hf_kwargs = model_paths(a.model)
    from mlxr import LLM

    llm = LLM(ref, dtype=dtype, device=a.device, weight_dtype=a.weight_dtype, max_num_seqs=a.max_num_seqs,
              max_num_batched_tokens=a.max_num_batched_tokens, kv_cache_memory_gb=a.kv_cache_gb)
    vocab = llm.args.vocab_size
    run_mlxr(llm, workload(vocab, 2, 16, 4, False), a.device)  # warm-up
    hf = None
    if not a.no_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(**hf_kwargs, dtype=hf_dtype).to(a.device).eval()
        run_hf(hf, workload(vocab, 2, 16, 4, False), a.device)  # warm-up, as for MLXR
    rows = []
    for b in a.batch:
        reqs = workload(vocab, b, a.prompt_len, a.gen_len, a.mixed)
        rows.append({"engine": "mlxr", "batch": b, **run_mlxr(llm, reqs, a.device)})
        if hf is not None:
            rows.append({"engine": "hf-transformers", "batch": b, **run_hf(hf, reqs, a.device)})
    meta = {"model": a.model, "device": device_name(a.device), "prompt_len": a.prompt_len,
            "gen_len": a.gen_len, "mixed": a.mixed, "hf_dtype": str(hf_dtype),
            "mlxr_dtype": dtype_label(llm), "engine_process": llm.loaded is None}
    path = write_result("throughput", {**meta, "results": rows})
    print_table(rows, ["engine", "batch", "total_s", "gen_tok_s", "decode_tok_s", "step_ms_median"])
    print(f"{meta} -> {path}")


if __name__ == "__main__":
    main()
