"""KV cache dtypes (--kv-cache-dtype) against the default cache, per bundled model:

- perplexity: `mlxr perplexity --json --kv-cache-dtype D` on one text (--text, --ctx, --chunks),
  each dtype's figure and its change from the default cache's (the issue's bounds: fp8 and q8_0
  within 0.5%, q4_0 within 3%);
- greedy agreement: --prompts greedy continuations of --gen tokens from the text, the share of
  positions equal to the default cache's and the tokens before the first difference;
- speed at --context tokens: prefill tok/s (the prompt's time to its first token) and decode
  tok/s (the tokens after it), dtypes interleaved run by run (a shared host moves all of them:
  read the ratios to the default), with the CPU named and the load average beside each run.
- the block count a --kv-cache-gb budget gives each dtype (the cache's capacity in tokens).

CPU (the default, 2 threads as CI):
  python bench/kv_dtypes.py
  python bench/kv_dtypes.py --models smollm2:135m --dtypes auto bf16 q8_0 --runs 3
GPU (the lent machine; one engine at a time): the 8B shape (bench/gpu/write_shape_gguf.py) at 4k
context, batch 256 (bf16 KV, 128 KB a token, does not fit 100 GB; q8_0 does), then batch 16 for
decode beside bf16:
  python bench/gpu/write_shape_gguf.py llama3-8b-shape /tmp/8b/model-f16.gguf
  python bench/kv_dtypes.py --device cuda --models /tmp/8b/model-f16.gguf --dtypes auto q8_0 q4_0 fp8 \\
      --context 4096 --batch 256 --kv-cache-gb 100 --skip perplexity agreement
  python bench/kv_dtypes.py --device cuda --models /tmp/8b/model-f16.gguf --dtypes auto q8_0 q4_0 fp8 \\
      --context 4096 --batch 16 --kv-cache-gb 100 --runs 3 --skip perplexity agreement
JSON to bench/results/<day>/kv_dtypes-*.json; tables last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import bench_folders  # noqa: F401,I001  (bench/ and bench/peers on sys.path)
from common import device_name, print_table, write_result

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("auto", "bf16", "fp16", "fp8", "q8_0", "q4_0")
DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"  # on every Debian system
PARTS = ("perplexity", "agreement", "speed")


def load() -> float:
    return round(os.getloadavg()[0], 2)


def perplexity(a, model: str, dtype: str) -> dict:
    argv = [sys.executable, "-m", "mlxr.cli", "perplexity", "--model", model, "--device", a.device,
            "--threads", str(a.threads), "--ctx", str(a.ctx), "--chunks", str(a.chunks), "--json",
            "--kv-cache-dtype", dtype, a.text]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=3600, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if run.returncode:
        raise SystemExit(f"mlxr perplexity failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def engine(a, model: str, dtype: str, context: int):
    import torch

    from mlxr import LLM

    torch.set_num_threads(a.threads)
    return LLM(model, device=a.device, kv_cache_dtype=dtype, max_model_len=context + a.gen + 16,
               max_num_seqs=max(a.batch, 1), enable_prefix_caching=False, kv_cache_memory_gb=a.kv_cache_gb,
               engine_process=False)


def timed(llm, prompts: list[list[int]], gen: int) -> tuple[float, float, list[list[int]]]:
    """(seconds to the last prompt's first token, decode tok/s after it, each prompt's tokens)."""
    from mlxr import SamplingParams

    eng, params = llm.engine, SamplingParams(temperature=0.0, max_tokens=gen, ignore_eos=True)
    ids = [f"kv-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params)
    started, tokens = {}, {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.outputs[0].token_ids and out.request_id not in started:
                started[out.request_id] = time.perf_counter()
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
    end, first = time.perf_counter(), max(started.values())
    return first - t0, len(prompts) * (gen - 1) / (end - first), [tokens[r] for r in ids]


def agreement(want: list[list[int]], got: list[list[int]]) -> tuple[float, float]:
    """(share of positions equal, mean tokens before the first difference)."""
    same = sum(x == y for w, g in zip(want, got) for x, y in zip(w, g))
    prefix = []
    for w, g in zip(want, got):
        n = next((i for i, (x, y) in enumerate(zip(w, g)) if x != y), len(w))
        prefix.append(n)
    return same / sum(len(w) for w in want), sum(prefix) / len(prefix)


def text_prompts(a, llm) -> list[list[int]]:
    ids = llm.tokenizer.encode(Path(a.text).read_text())
    step = max(len(ids) // a.prompts, 64)
    return [ids[i * step: i * step + 48] for i in range(a.prompts)]


def random_prompt(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(100, 30000) for _ in range(n)]


def bench_model(a, model: str) -> list[dict]:
    rows: list[dict] = []
    if "perplexity" not in a.skip:
        for dtype in a.dtypes:
            before = load()
            r = perplexity(a, model, dtype)
            rows.append({"part": "perplexity", "model": model, "kv": dtype, "ppl": r["ppl"], "stderr": r["stderr"],
                         "scored": r["scored_tokens"], "load": [before, load()]})
        base = next(r["ppl"] for r in rows if r["kv"] == a.dtypes[0])
        for r in rows:
            r["ppl_change_pct"] = 100 * (r["ppl"] / base - 1)
        print_table(rows, ["model", "kv", "ppl", "ppl_change_pct", "scored"])
    if "agreement" in a.skip and "speed" in a.skip:
        return rows
    if a.device == "cpu" and not a.one_at_a_time:  # every dtype's engine at once: interleaved runs
        llms = {d: engine(a, model, d, a.context) for d in a.dtypes}
        try:
            rows += [r for r in measure(a, model, llms) if r["part"] != "agreement_tokens"]
        finally:
            for llm in llms.values():
                llm.shutdown()
        return rows
    first = None  # one engine at a time (on a GPU an 8B model's weights and cache each)
    for d in a.dtypes:
        llm = engine(a, model, d, a.context)
        try:
            got = measure(a, model, {d: llm}, first)
            first = first or next((r["tokens"] for r in got if r["part"] == "agreement_tokens"), None)
            rows += [r for r in got if r["part"] != "agreement_tokens"]
        finally:
            llm.shutdown()
    return rows


def measure(a, model: str, llms: dict, base_tokens: list[list[int]] | None = None) -> list[dict]:
    """Capacity, greedy agreement with the first dtype's tokens (base_tokens when given) and the
    speed runs of these engines, interleaved run by run."""
    rows: list[dict] = []
    for d, llm in llms.items():
        core = llm.engine.core.core
        rows.append({"part": "capacity", "model": model, "kv": d, "blocks": core.num_blocks,
                     "tokens": core.num_blocks * core.config.block_size,
                     "fits_batch_at_context": core.num_blocks * core.config.block_size >= a.batch * (a.context + a.gen)})
    if "agreement" not in a.skip:
        prompts = text_prompts(a, next(iter(llms.values())))
        outs = {d: timed(llm, prompts, a.gen)[2] for d, llm in llms.items()}
        base = base_tokens or outs[next(iter(outs))]
        rows.append({"part": "agreement_tokens", "tokens": base})
        for d in llms:
            share, prefix = agreement(base, outs[d])
            rows.append({"part": "agreement", "model": model, "kv": d, "same_share": share,
                         "first_diff_mean": prefix, "gen": a.gen, "prompts": len(prompts)})
    if "speed" not in a.skip:
        for run in range(a.runs):
            prompts = [random_prompt(a.context, 1000 * run + i) for i in range(a.batch)]
            for d, llm in llms.items():
                core = llm.engine.core.core
                if a.batch * (a.context + a.gen) > core.num_blocks * core.config.block_size:
                    continue  # does not fit this dtype's cache
                before = load()
                ttft, decode, _ = timed(llm, prompts, a.gen)
                rows.append({"part": "speed", "model": model, "kv": d, "run": run, "context": a.context,
                             "batch": a.batch, "prefill_tok_s": a.batch * a.context / ttft,
                             "decode_tok_s": decode, "load": [before, load()]})
    return rows


def summary(rows: list[dict], base: str) -> list[dict]:
    """Per model and dtype: perplexity change, agreement, median speeds and their ratio to base."""
    from statistics import median

    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        speed = {}
        for d in dict.fromkeys(r["kv"] for r in mine):
            runs = [r for r in mine if r["kv"] == d and r["part"] == "speed"]
            if runs:
                speed[d] = (median(r["prefill_tok_s"] for r in runs), median(r["decode_tok_s"] for r in runs))
        for d in dict.fromkeys(r["kv"] for r in mine):
            row = {"model": model, "kv": d}
            for r in mine:
                if r["kv"] == d and r["part"] == "perplexity":
                    row.update(ppl=r["ppl"], ppl_change_pct=r["ppl_change_pct"])
                if r["kv"] == d and r["part"] == "agreement":
                    row.update(same_share=r["same_share"], first_diff_mean=r["first_diff_mean"])
                if r["kv"] == d and r["part"] == "capacity":
                    row.update(blocks=r["blocks"])
            if d in speed:
                row.update(prefill_tok_s=speed[d][0], decode_tok_s=speed[d][1])
                if base in speed:
                    row.update(prefill_x=speed[d][0] / speed[base][0], decode_x=speed[d][1] / speed[base][1])
            out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["smollm2:135m", "gemma3-270m"])
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), help="the first is the base of the ratios")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--ctx", type=int, default=512, help="perplexity's chunk")
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8, help="greedy agreement's prompts")
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--context", type=int, default=4096, help="speed: prompt tokens")
    p.add_argument("--batch", type=int, default=1, help="speed: prompts at once")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--kv-cache-gb", type=float, default=1.0)
    p.add_argument("--skip", nargs="*", default=[], choices=PARTS)
    p.add_argument("--one-at-a-time", action="store_true", help="one engine loaded at a time (always on a GPU)")
    a = p.parse_args()
    rows = [r for m in a.models for r in bench_model(a, m)]
    table = summary(rows, a.dtypes[0])
    path = write_result("kv_dtypes", {"device": device_name(a.device), "args": vars(a), "host_shared": True,
                                      "rows": rows, "summary": table})
    print_table(table, ["model", "kv", "blocks", "ppl", "ppl_change_pct", "same_share", "first_diff_mean",
                        "prefill_tok_s", "decode_tok_s", "prefill_x", "decode_x"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
