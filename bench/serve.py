"""Serving through the HTTP API: streamed /v1/completions at Poisson arrival rates, against a
`mlxr serve` this script starts (or --url of a running one). Per rate: request and token
throughput, TTFT / TPOT / ITL / e2e p50 and p99. JSON to bench/results/serve-*.json.

  python bench/serve.py --model gemma3-270m --rates 0.5 1 2 inf
  python bench/serve.py --model path/to/model.gguf --device cuda --rates 4 16 inf --num-requests 256
  python bench/serve.py --url http://127.0.0.1:11434 --served-model gemma3-270m

Definitions: duration = the last stream's end - the rate's first send (every request, arrival
gaps included); out_tok_s = the completed requests' completion tokens, from each stream's usage
chunk, over that duration. TTFT = first chunk with a choice - that request's send; a chunk may
carry several tokens (a server that falls behind merges deltas), so TPOT spreads a stream's
first-to-last chunk time over its tokens and ITL is the gap between chunks. The client (aiohttp
where installed, else httpx: --client) splits each network read into its events; a chunk's time
is when its bytes were read. Its ceiling: bench/probes/sse_client_ceiling.py.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson

from common import device_name, print_table, write_result
from stream_clients import AiohttpClient, HttpxClient, Outcome, client_kind  # noqa: F401 - re-exported
from stream_clients import make_client as _make_client

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = "gemma3-270m"
# Forwarded to `mlxr serve` as --flag value when given.
SERVER_FLAGS = ("device", "dtype", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "kv_cache_gb", "max_waiting", "stream_interval", "api_servers")
CORE_METRICS = ("vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
# Counted by each API process (--api-servers N): summed over them.
API_METRICS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "mlxr:num_requests_aborted_total")
METRICS = CORE_METRICS + API_METRICS
COLUMNS = ["rate", "completed", "failed", "duration_s", "req_s", "out_tok_s", "ttft_p50_ms", "ttft_p99_ms",
           "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
           "server_cpu_us_per_token", "server_cpu_us_per_chunk"]


def resolve_model(model: str) -> list[str]:
    """`mlxr serve` arguments naming the model; MLXR_HOME is fresh, so only paths and the bundled
    model resolve there (the test fixtures are found by name for convenience)."""
    if model == BUNDLED:
        return []
    from mlxr.testing.fixtures import CONFIGS, fixture_paths

    if not Path(model).exists() and model in CONFIGS:
        model = str(fixture_paths(model, ROOT / ".fixtures").gguf_path)
    return ["--model", model]


def server_args(a: argparse.Namespace) -> list[str]:
    out = resolve_model(a.model)
    for name in SERVER_FLAGS:
        value = getattr(a, name)
        if value is not None:
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out


@contextlib.contextmanager
def server(a: argparse.Namespace) -> Iterator[str]:
    """Base URL: --url as given, else a `mlxr serve` subprocess on a free port with a temp home
    (whose pid becomes a.server_pid, so its CPU time is read)."""
    if a.url:
        yield a.url.rstrip("/")
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from server_harness import server_process

    with (tempfile.TemporaryDirectory(prefix="mlxr-bench-") as home,
          server_process(Path(home), *server_args(a), timeout_s=a.start_timeout) as (url, proc)):
        a.server_pid = a.server_pid or proc.pid
        yield url


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of one process (not its children: the engine core is one), from
    /proc; None without a pid or off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (OSError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_running(pid: int, module: str) -> list[int]:
    """The child processes of `pid` that run `python -m module` (Linux /proc)."""
    found = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    if module.encode() in Path(f"/proc/{child}/cmdline").read_bytes():
                        found.append(int(child))
    return sorted(found)


def api_pids(server_pid: int | None) -> list[int]:
    """The processes that serve HTTP: a supervisor's API processes (--api-servers N > 1), or
    the server itself."""
    if server_pid is None:
        return []
    return children_running(server_pid, "mlxr.server.api_worker") or [server_pid]


def cpu_each(pids: list[int]) -> list[float] | None:
    seconds = [cpu_seconds(p) for p in pids]
    return None if not seconds or None in seconds else seconds


def served_model(url: str, wanted: str | None) -> tuple[str, int]:
    """(model name to request, its vocabulary size); default: the first loaded model."""
    name = wanted
    if name is None:
        loaded = httpx.get(f"{url}/api/ps", timeout=30).raise_for_status().json()["models"]
        if not loaded:
            raise SystemExit("the server has no loaded model: pass --served-model")
        name = loaded[0]["name"]
    info = httpx.post(f"{url}/api/show", json={"model": name}, timeout=60).raise_for_status().json()["model_info"]
    vocab = next(v for k, v in info.items() if k.endswith(".vocab_size"))
    return name, int(vocab)


def prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(count)]


def arrival_delays(rate: float, count: int, seed: int) -> list[float]:
    """Gaps before each request: exponential (a Poisson process); all zero for rate inf."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    return [rng.expovariate(rate) for _ in range(count)]


def payload(model: str, ids: list[int], gen_len: int) -> dict:
    return {"model": model, "prompt": ids, "max_tokens": gen_len, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


def read_event(out: Outcome, data: bytes | str) -> bool:
    """Fold one SSE `data:` payload into out; False once the stream is over."""
    if data in (b"[DONE]", "[DONE]"):
        return False
    obj = orjson.loads(data)
    if "error" in obj:
        out.error = str(obj["error"].get("message", obj["error"]))
        return False
    if obj.get("choices"):
        out.chunk_times.append(time.perf_counter())
    if obj.get("usage"):
        out.tokens = int(obj["usage"]["completion_tokens"])
    return True


def make_client(kind: str, timeout_s: float) -> HttpxClient | AiohttpClient:
    """Call from a coroutine. Events go through this module's read_event (looked up at each
    call, so that a caller may wrap it, as ../shared/peers/serve_cmp.py does)."""
    return _make_client(kind, timeout_s, lambda out, data: read_event(out, data))


async def send(client: HttpxClient | AiohttpClient, url: str, body: dict) -> Outcome:
    """One streamed request (a module-level name, so that a caller may wrap it)."""
    return await client.send(url, body)


async def run_rate(client: HttpxClient | AiohttpClient, url: str, bodies: list[dict], delays: list[float]) -> tuple[list[Outcome], float]:
    """Send every body after its delay (cumulative); returns the outcomes and the wall time."""
    t0 = time.perf_counter()
    tasks = []
    for body, delay in zip(bodies, delays):
        if delay:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(client, url, body)))
    outcomes = await asyncio.gather(*tasks)
    return outcomes, max(o.done for o in outcomes) - t0


def pct(xs: list[float], q: float, scale: float = 1000.0) -> float | None:
    return float(np.percentile(xs, q)) * scale if xs else None


def rate_figures(rate: float, outcomes: list[Outcome], duration: float) -> dict:
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft() for o in ok]
    tpot = [t for o in ok if (t := o.tpot()) is not None]
    gaps = [g for o in ok for g in o.gaps()]
    e2e = [o.done - o.sent for o in ok]
    row = {"rate": "inf" if math.isinf(rate) else rate, "completed": len(ok), "failed": len(outcomes) - len(ok),
           "duration_s": duration, "req_s": len(ok) / duration, "out_tok_s": sum(o.tokens for o in ok) / duration}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", gaps), ("e2e", e2e)):
        row[f"{name}_p50_ms"], row[f"{name}_p99_ms"] = pct(xs, 50), pct(xs, 99)
    row["mean_tokens_per_chunk"] = sum(o.tokens for o in ok) / max(1, sum(len(o.chunk_times) for o in ok))
    row["requests"] = [o.summary() for o in outcomes]
    return row


def add_server_cpu(row: dict, before: list[float] | None, after: list[float] | None, outcomes: list[Outcome]) -> None:
    """The API processes' CPU seconds over the rate (each, and their sum), and per output token:
    what bounds serving when the API side is the bottleneck, and steadier than tok/s on a
    shared CPU."""
    if before is None or after is None:
        return
    each = [a - b for a, b in zip(after, before)]
    tokens = sum(o.tokens for o in outcomes if o.ok)
    chunks = sum(len(o.chunk_times) for o in outcomes if o.ok)
    row["server_cpu_s"] = sum(each)
    row["server_cpu_s_each"] = each
    row["server_cpu_us_per_token"] = sum(each) / max(1, tokens) * 1e6
    row["server_cpu_us_per_chunk"] = sum(each) / max(1, chunks) * 1e6


def scrape_metrics(url: str, tries: int = 64) -> dict[str, float]:
    """The METRICS counters from /metrics, summed over their labels; under --api-servers N the
    API processes' own counters are summed over every process (each new connection reaches one,
    which mlxr:api_server_info names) and the core's are read once."""
    from prometheus_client.parser import text_string_to_metric_families

    per_process: dict[str, dict[str, float]] = {}
    count = 1
    for _ in range(tries):
        text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text  # a new connection each
        figures, index = dict.fromkeys(METRICS, 0.0), "0"
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in figures:
                    figures[sample.name] += sample.value
                elif sample.name == "mlxr:api_server_info":
                    index, count = sample.labels["index"], int(sample.labels["count"])
        per_process[index] = figures
        if len(per_process) >= count:
            break
    first = next(iter(per_process.values()))
    out = {k: first[k] for k in CORE_METRICS}
    out.update({k: sum(p[k] for p in per_process.values()) for k in API_METRICS})
    out["api_processes_scraped"] = len(per_process)
    return out


async def sweep(a: argparse.Namespace, url: str, model: str, vocab: int) -> list[dict]:
    async with make_client(getattr(a, "client", "auto"), a.request_timeout) as client:
        await send(client, url, payload(model, prompts(vocab, 1, 8, a.seed - 1)[0], 4))  # warm-up
        rows = []
        for i, rate in enumerate(a.rates):
            # Fresh prompts per rate so that no rate rides on another's prefix cache.
            ids = prompts(vocab, a.num_requests, a.prompt_len, a.seed + i)
            bodies = [payload(model, p, a.gen_len) for p in ids]
            pids = api_pids(getattr(a, "server_pid", None))
            cpu0 = cpu_each(pids)
            outcomes, duration = await run_rate(client, url, bodies, arrival_delays(rate, a.num_requests, a.seed + i))
            rows.append(rate_figures(rate, outcomes, duration))
            add_server_cpu(rows[-1], cpu0, cpu_each(pids), outcomes)
            print(f"rate {rate}: {rows[-1]['completed']} ok, {rows[-1]['failed']} failed in {duration:.1f}s",
                  file=sys.stderr, flush=True)
        return rows


def parse_rate(text: str) -> float:
    rate = float(text)
    if not rate > 0:
        raise argparse.ArgumentTypeError("rates must be > 0 (or inf)")
    return rate


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=BUNDLED, help="model to serve: gemma3-270m (bundled), a path, or a fixture name")
    p.add_argument("--url", default=None, help="benchmark a running server instead of starting one")
    p.add_argument("--served-model", default=None, help="model name in requests (default: the first loaded)")
    p.add_argument("--rates", type=parse_rate, nargs="+", default=[0.5, 1.0, 2.0, math.inf],
                   help="requests per second; inf = all at once")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client", choices=("auto", "aiohttp", "httpx"), default="auto",
                   help="HTTP client reading the streams (auto: aiohttp where installed)")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--label", default=None, help="a note kept in the JSON (which tree a --url server runs)")
    p.add_argument("--server-pid", type=int, default=None,
                   help="pid of the --url server (its API processes' CPU time per token is reported)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--kv-cache-gb", type=float, default=None)
    p.add_argument("--max-waiting", type=int, default=None)
    p.add_argument("--stream-interval", type=int, default=None, help="the started server's --stream-interval")
    p.add_argument("--api-servers", type=int, default=None, help="the started server's --api-servers")
    return p.parse_args()


def main() -> int:
    a = parse_args()
    with server(a) as url:
        model, vocab = served_model(url, a.served_model)
        rows = asyncio.run(sweep(a, url, model, vocab))
        metrics = scrape_metrics(url)
    device = f"remote server {a.url}" if a.url else device_name(a.device or "cpu")
    meta = {"model": a.model, "served_model": model, "device": device, "prompt_len": a.prompt_len,
            "gen_len": a.gen_len, "num_requests": a.num_requests, "seed": a.seed,
            "rates": ["inf" if math.isinf(r) else r for r in a.rates],
            "server_args": None if a.url else server_args(a), "label": a.label}
    path = write_result("serve", {**meta, "server_metrics": metrics, "results": rows})
    print(f"{meta} -> {path}")
    print(f"server metrics: {metrics}")
    print_table(rows, COLUMNS)
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
