"""All-at-once HTTP serving as a fraction of the engine's own offline rate: same model, same
device, same engine settings, runs interleaved (offline, HTTP, offline, HTTP, ...).

- offline: bench/throughput.py's run_mlxr, `--batch` requests added at once to an LLM in this
  process; `decode_tok_s` counts the tokens after every request has its first one over the
  time from then (gpu_sweep's batch-256 figure), `gen_tok_s` all output tokens over the whole
  run (prefill included).
- HTTP: bench/serve.py's all-at-once load on a `mlxr serve` this script starts: `--batch`
  streamed /v1/completions sent at once; out_tok_s = completion tokens (from each stream's
  usage) / (last stream's end - first send), so admission, prefill and streaming all count.
- ratio_decode = HTTP out_tok_s / offline decode_tok_s (the issue's target: >= 0.6),
  ratio_gen = HTTP out_tok_s / offline gen_tok_s (the same work end to end).
- api_cpu_s / core_cpu_s: CPU seconds the server's API process and its engine-core process
  spent in each HTTP run (Linux /proc); client_cpu_s: this script's own, while it read them.
JSON to bench/results/serve_ratio-*.json.

  python bench/serve_ratio.py --model tinyllama-shape --device cuda --dtype bfloat16 --runs 5  # GPU
  python bench/serve_ratio.py --model tiny-llama --prompt-len 120 --engine-process on     # CPU
  python bench/serve_ratio.py ... --stream-interval 8   # the server writes 8 tokens a chunk at least
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import serve
from common import device_name, median, print_table, write_result
from latency import model_paths
from throughput import run_mlxr, workload

COLUMNS = ["run", "offline_decode_tok_s", "offline_gen_tok_s", "http_out_tok_s", "ratio_decode", "ratio_gen",
           "ttft_p50_ms", "ttft_p99_ms", "api_cpu_s", "core_cpu_s", "client_cpu_s", "failed"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_pid(pid: int) -> int | None:
    """The engine-core child of server `pid` (None when the server runs its core in-process)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"core_proc" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    return None


async def http_run(a: argparse.Namespace, client, url: str, model: str, vocab: int, run: int, pids: tuple[int, int]) -> dict:
    ids = serve.prompts(vocab, a.batch, a.prompt_len, a.seed + 1000 + run)
    bodies = [serve.payload(model, p, a.gen_len) for p in ids]
    before = [cpu_seconds(p) for p in pids]
    client_before = time.process_time()
    outcomes, duration = await serve.run_rate(client, url, bodies, [0.0] * a.batch)
    row = serve.rate_figures(math.inf, outcomes, duration)
    row["errors"] = sorted({r["error"] for r in row.pop("requests") if r["error"]})[:5]
    row["client_cpu_s"] = time.process_time() - client_before
    row["api_cpu_s"], row["core_cpu_s"] = (cpu_seconds(p) - b for p, b in zip(pids, before))
    return row


def offline_run(a: argparse.Namespace, llm, vocab: int, run: int) -> dict:
    return run_mlxr(llm, workload(vocab, a.batch, a.prompt_len, a.gen_len, False, seed=a.seed + 100 + run), a.device)


def server_flags(a: argparse.Namespace, ref: str) -> list[str]:
    flags = ["--model", ref, "--device", a.device, "--max-num-seqs", str(a.batch),
             "--max-num-batched-tokens", str(a.max_num_batched_tokens), "--kv-cache-gb", str(a.kv_cache_gb)]
    return flags + (["--dtype", a.dtype] if a.dtype else []) + ["--stream-interval", str(a.stream_interval)]


async def measure(a: argparse.Namespace, ref: str, llm, vocab: int) -> tuple[list[dict], dict]:
    """The interleaved runs (the offline ones block this event loop, which is idle then)."""
    sys.path.insert(0, str(serve.ROOT / "tests"))
    from server_harness import server_process

    rows = []
    with (tempfile.TemporaryDirectory(prefix="mlxr-bench-") as home,
          server_process(Path(home), *server_flags(a, ref), timeout_s=a.start_timeout) as (url, proc)):
        model, _ = serve.served_model(url, None)
        pids = (proc.pid, core_pid(proc.pid) or proc.pid)
        async with serve.make_client(a.client, 600.0) as client:
            await serve.send(client, url, serve.payload(model, serve.prompts(vocab, 1, 8, a.seed - 1)[0], 4))
            for run in range(-a.warmup_runs, a.runs):  # the first full-size pairs warm both engines up
                row = await one_pair(a, llm, client, url, model, vocab, run, pids)
                if run >= 0:
                    rows.append(row)
        server_metrics = serve.scrape_metrics(url)
    return rows, server_metrics


async def one_pair(a: argparse.Namespace, llm, client, url: str, model: str, vocab: int, run: int,
                   pids: tuple[int, int]) -> dict:
    off = offline_run(a, llm, vocab, run)
    http = await http_run(a, client, url, model, vocab, run, pids)
    print(f"run {run}: offline {off['decode_tok_s']:,.0f} decode / {off['gen_tok_s']:,.0f} gen tok/s, "
          f"HTTP {http['out_tok_s']:,.0f} out tok/s", file=sys.stderr, flush=True)
    return {"run": run, "offline_decode_tok_s": off["decode_tok_s"], "offline_gen_tok_s": off["gen_tok_s"],
            "http_out_tok_s": http["out_tok_s"], "ratio_decode": http["out_tok_s"] / off["decode_tok_s"],
            "ratio_gen": http["out_tok_s"] / off["gen_tok_s"], "offline": off, "http": http,
            **{k: http[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "api_cpu_s", "core_cpu_s", "client_cpu_s",
                                    "failed")}}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama", help="a fixture name (e.g. tinyllama-shape), a path, gemma3-270m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--batch", type=int, default=256, help="requests at once, offline and over HTTP")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup-runs", type=int, default=1, help="pairs run first and left out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-gb", type=float, default=8.0, help="each of the two engines")
    p.add_argument("--engine-process", choices=["on", "off"], default=None,
                   help="the engine core in its own process, offline and in the server (default: the engine's choice)")
    p.add_argument("--client", choices=("auto", "aiohttp", "httpx"), default="auto")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--stream-interval", type=int, default=1, help="the server's --stream-interval")
    return p.parse_args()


def main() -> int:
    a = parse_args()
    if a.engine_process is not None:  # read by the server's config and by the LLM below alike
        os.environ["MLXR_ENGINE_PROCESS"] = "1" if a.engine_process == "on" else "0"
    from mlxr import LLM

    ref, _ = model_paths(a.model)
    llm = LLM(ref, dtype=getattr(torch, a.dtype) if a.dtype else None, device=a.device, max_num_seqs=a.batch,
              max_num_batched_tokens=a.max_num_batched_tokens, kv_cache_memory_gb=a.kv_cache_gb)
    vocab = llm.args.vocab_size
    run_mlxr(llm, workload(vocab, 2, 16, 4, False), a.device)  # warm-up
    rows, metrics = asyncio.run(measure(a, ref, llm, vocab))
    summary = {k: median([r[k] for r in rows]) for k in ("ratio_decode", "ratio_gen", "http_out_tok_s",
                                                          "offline_decode_tok_s", "offline_gen_tok_s")}
    meta = {"model": a.model, "path": ref, "device": device_name(a.device), "dtype": a.dtype, "batch": a.batch,
            "prompt_len": a.prompt_len, "gen_len": a.gen_len, "engine_process": llm.loaded is None,
            "client": serve.client_kind(a.client), "stream_interval": a.stream_interval, "server_metrics": metrics}
    llm.shutdown()
    path = write_result("serve_ratio", {**meta, "medians": summary, "results": rows})
    print_table(rows, COLUMNS)
    print(f"medians: {summary}\n{path}")
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
