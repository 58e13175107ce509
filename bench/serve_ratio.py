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
- api_cpu_s / core_cpu_s: CPU seconds the server's API processes (summed; api_cpu_s_each: each
  of `--api-servers` N) and its engine-core process spent in each HTTP run (Linux /proc);
  client_cpu_s: this script's own, while it read them.
JSON to bench/results/serve_ratio-*.json.

  python bench/serve_ratio.py --model tinyllama-shape --device cuda --dtype bfloat16 --runs 5  # GPU
  python bench/serve_ratio.py --model tiny-llama --prompt-len 120 --engine-process on     # CPU
  python bench/serve_ratio.py ... --stream-interval 8   # the server writes 8 tokens a chunk at least
  python bench/serve_ratio.py ... --api-servers 4       # four API processes in front of the core
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


def server_pids(pid: int) -> tuple[list[int], int]:
    """(the API processes, the engine core) of server `pid`; the core is the server itself when
    it runs in-process."""
    cores = serve.children_running(pid, "mlxr.engine.core.core_proc")
    return serve.api_pids(pid), cores[0] if cores else pid


async def http_run(a: argparse.Namespace, client, url: str, model: str, vocab: int, run: int,
                   pids: tuple[list[int], int]) -> dict:
    ids = serve.prompts(vocab, a.batch, a.prompt_len, a.seed + 1000 + run)
    bodies = [serve.payload(model, p, a.gen_len) for p in ids]
    api, core = pids
    before = serve.cpu_each([*api, core])
    client_before = time.process_time()
    outcomes, duration = await serve.run_rate(client, url, bodies, [0.0] * a.batch)
    row = serve.rate_figures(math.inf, outcomes, duration)
    row["errors"] = sorted({r["error"] for r in row.pop("requests") if r["error"]})[:5]
    row["client_cpu_s"] = time.process_time() - client_before
    spent = [after - b for after, b in zip(serve.cpu_each([*api, core]), before)]
    row["api_cpu_s_each"], row["core_cpu_s"] = spent[:-1], spent[-1]
    row["api_cpu_s"] = sum(row["api_cpu_s_each"])
    return row


def offline_run(a: argparse.Namespace, llm, vocab: int, run: int) -> dict:
    return run_mlxr(llm, workload(vocab, a.batch, a.prompt_len, a.gen_len, False, seed=a.seed + 100 + run), a.device)


def server_flags(a: argparse.Namespace, ref: str) -> list[str]:
    flags = ["--model", ref, "--device", a.device, "--max-num-seqs", str(a.batch),
             "--max-num-batched-tokens", str(a.max_num_batched_tokens), "--kv-cache-gb", str(a.kv_cache_gb)]
    flags += ["--stream-interval", str(a.stream_interval), "--api-servers", str(a.api_servers)]
    return flags + (["--dtype", a.dtype] if a.dtype else [])


async def measure(a: argparse.Namespace, ref: str, llm, vocab: int) -> tuple[list[dict], dict]:
    """The interleaved runs (the offline ones block this event loop, which is idle then)."""
    sys.path.insert(0, str(serve.ROOT / "tests"))
    from server_harness import server_process

    rows = []
    with (tempfile.TemporaryDirectory(prefix="mlxr-bench-") as home,
          server_process(Path(home), *server_flags(a, ref), timeout_s=a.start_timeout) as (url, proc)):
        model, _ = serve.served_model(url, None)
        pids = server_pids(proc.pid)
        async with serve.make_client(a.client, 600.0) as client:
            await serve.send(client, url, serve.payload(model, serve.prompts(vocab, 1, 8, a.seed - 1)[0], 4))
            for run in range(-a.warmup_runs, a.runs):  # the first full-size pairs warm both engines up
                row = await one_pair(a, llm, client, url, model, vocab, run, pids)
                if run >= 0:
                    rows.append(row)
        server_metrics = serve.scrape_metrics(url)
    return rows, server_metrics


async def one_pair(a: argparse.Namespace, llm, client, url: str, model: str, vocab: int, run: int,
                   pids: tuple[list[int], int]) -> dict:
    off = offline_run(a, llm, vocab, run)
    # The offline run blocked this loop: let it see the connections the server closed meanwhile
    # (uvicorn's 5 s keep-alive), or the client reuses them and its writes fail.
    await asyncio.sleep(0.2)
    http = await http_run(a, client, url, model, vocab, run, pids)
    print(f"run {run}: offline {off['decode_tok_s']:,.0f} decode / {off['gen_tok_s']:,.0f} gen tok/s, "
          f"HTTP {http['out_tok_s']:,.0f} out tok/s", file=sys.stderr, flush=True)
    return {"run": run, "offline_decode_tok_s": off["decode_tok_s"], "offline_gen_tok_s": off["gen_tok_s"],
            "http_out_tok_s": http["out_tok_s"], "ratio_decode": http["out_tok_s"] / off["decode_tok_s"],
            "ratio_gen": http["out_tok_s"] / off["gen_tok_s"], "offline": off, "http": http,
            **{k: http[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "api_cpu_s", "api_cpu_s_each", "core_cpu_s",
                                    "client_cpu_s", "failed")}}


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
    p.add_argument("--api-servers", type=int, default=1,
                   help="the server's --api-servers (API processes in front of its engine core; above 1 the "
                        "core runs in its own process)")
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
            "client": serve.client_kind(a.client), "stream_interval": a.stream_interval, "api_servers": a.api_servers,
            "server_metrics": metrics}
    llm.shutdown()
    path = write_result("serve_ratio", {**meta, "medians": summary, "results": rows})
    print_table(rows, COLUMNS)
    print(f"medians: {summary}\n{path}")
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
