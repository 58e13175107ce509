"""Soak of issue 51: `--streams` concurrent streamed chat requests on the bundled chat model for
`--seconds`, a random `--disconnect` share of them dropped mid-stream, /health probed every
0.5 s in its own thread and the server's RSS (its process and children) sampled throughout.

    PYTHONPATH=$PWD .venv/bin/python bench/soak.py                 # 200 streams, 30% drops, 3 min
    PYTHONPATH=$PWD .venv/bin/python bench/soak.py --seconds 30 --streams 20

Targets (non-zero exit on a miss): no failure but the planned drops; running, waiting and KV
blocks in use back to 0 within --drain seconds; RSS growth under 10% after --warmup seconds;
every /health answer 200 within 1 s. Writes results/<day>/soak-<stamp>.json."""
from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import openai

from common import cpu_model, print_table, write_result
from soak_parts import (
    CHAT_MODEL, HealthProbe, StreamResult, chat_body, registry_check, start_server, still_alive,
    stop_server, stream_chat, tree, tree_rss, wait_drained,
)

MAX_REQUESTS_PER_STREAM = 10_000
RSS_EVERY_S = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--disconnect", type=float, default=0.3, help="share of streams dropped mid-stream")
    p.add_argument("--openai-share", type=float, default=0.1, help="share of requests sent by the openai client")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds before the RSS baseline")
    p.add_argument("--drain", type=float, default=30.0, help="seconds allowed for the gauges to go back to 0")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--end-grace", type=float, default=120.0, help="after --seconds, how long in-flight requests may take")
    p.add_argument("--model", default=CHAT_MODEL)
    p.add_argument("--seed", type=int, default=51)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("serve_args", nargs="*", help="extra `mlxr serve` arguments (after --)")
    return p.parse_args(argv)


async def openai_stream(client: openai.AsyncOpenAI, body: dict, drop_after: int | None) -> StreamResult:
    """The same request through the official client (its own connection pool and SSE parser)."""
    out = StreamResult(started=time.monotonic())
    try:
        stream = await client.chat.completions.create(**body)
        finished = False
        async for chunk in stream:
            out.chunks += 1
            out.first_chunk = out.first_chunk or time.monotonic()
            if chunk.choices and chunk.choices[0].finish_reason:
                finished = True
            if drop_after is not None and out.chunks >= drop_after:
                out.kind = "disconnected"
                await stream.close()
                break
        if out.kind == "ok" and not finished:
            out.kind, out.error = "failed", "stream ended without a finish_reason"
    except openai.OpenAIError as e:
        out.kind, out.error = "failed", f"{type(e).__name__}: {e}"
    out.ended = time.monotonic()
    return out


async def one_stream(index: int, a: argparse.Namespace, url: str, session, client, deadline: float,
                     results: list[StreamResult]) -> None:
    rng = random.Random(a.seed * 1_000_003 + index)
    for _ in range(MAX_REQUESTS_PER_STREAM):
        if time.monotonic() >= deadline:
            return
        body = chat_body(a.model, rng)
        drop_after = rng.randint(1, 6) if rng.random() < a.disconnect else None
        if rng.random() < a.openai_share:
            body.pop("model")
            results.append(await openai_stream(client, {"model": a.model, **body}, drop_after))
        else:
            results.append(await stream_chat(session, url, body, drop_after, a.request_timeout))


async def sample_rss(pid: int, samples: list[tuple[float, int]], stop: asyncio.Event, limit_s: float) -> None:
    t0 = time.monotonic()
    while not stop.is_set() and time.monotonic() - t0 < limit_s:
        samples.append((time.monotonic(), tree_rss(pid)))
        try:
            await asyncio.wait_for(stop.wait(), RSS_EVERY_S)
        except TimeoutError:
            pass


async def drive(a: argparse.Namespace, url: str, pid: int) -> tuple[list[StreamResult], int, list, float]:
    """Run the load; returns the results, the requests cut off at the end, the RSS samples and
    when the load began."""
    results: list[StreamResult] = []
    rss: list[tuple[float, int]] = []
    stop = asyncio.Event()
    start = time.monotonic()
    deadline = start + a.seconds
    sampler = asyncio.create_task(sample_rss(pid, rss, stop, a.seconds + a.end_grace + 10))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session, \
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=a.request_timeout) as client:
        tasks = [asyncio.create_task(one_stream(i, a, url, session, client, deadline, results))
                 for i in range(a.streams)]
        done, pending = await asyncio.wait(tasks, timeout=a.seconds + a.end_grace)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                results.append(StreamResult("failed", f"client task raised {t.exception()!r}"))
    stop.set()
    await sampler
    return results, len(pending), rss, start


def rss_figures(rss: list[tuple[float, int]], start: float, warmup_s: float, load_end: float) -> dict:
    """Baseline: the median of the 10 s after the warm-up; end: the median of the load's last 10 s."""
    after = [(t, r) for t, r in rss if start + warmup_s <= t <= load_end]
    base = [r for t, r in after if t <= start + warmup_s + 10] or [r for _, r in after[:3]]
    end = [r for t, r in after if t >= load_end - 10] or [r for _, r in after[-3:]]
    if not base or not end:
        return {"samples": len(rss), "growth": None}
    b, e = statistics.median(base), statistics.median(end)
    return {"samples": len(rss), "baseline_mb": b / 2**20, "end_mb": e / 2**20,
            "max_after_warmup_mb": max(r for _, r in after) / 2**20, "growth": e / b - 1,
            "max_growth": max(r for _, r in after) / b - 1}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mlxr-soak-") as tmp:
        home = Path(tmp) / "home"
        server = start_server(home, *a.serve_args, timeout_s=a.start_timeout)
        pids = [p.pid for p in tree(server.proc.pid)]
        probe = HealthProbe(server.url)
        try:
            probe.start()
            results, cut_off, rss, start = asyncio.run(drive(a, server.url, server.proc.pid))
            load_end = time.monotonic()
            drained, drain_s = wait_drained(server.url, a.model, a.drain)
            probe.stop()
            registry = registry_check(home)
        finally:
            probe.stop()
            pids = sorted(set(pids) | {p.pid for p in tree(server.proc.pid)})
            code = stop_server(server)
        left = still_alive(pids)
        log_tail = server.log_path.read_text(errors="replace")[-4000:]
    return report(a, results, cut_off, rss_figures(rss, start, a.warmup, load_end), probe.figures(),
                  drained, drain_s, registry, code, left, log_tail)


def report(a, results, cut_off, rss, health, drained, drain_s, registry, code, left, log_tail) -> int:
    counts = {k: sum(r.kind == k for r in results) for k in ("ok", "disconnected", "failed")}
    errors: dict[str, int] = {}
    for r in results:
        if r.kind == "failed":
            errors[(r.error or "?")[:120]] = errors.get((r.error or "?")[:120], 0) + 1
    ttfts = sorted(r.first_chunk - r.started for r in results if r.first_chunk)
    targets = {
        "no_failures": counts["failed"] == 0 and cut_off == 0,
        "drained": drain_s is not None,
        "rss_growth_under_10pct": rss.get("growth") is not None and rss["growth"] < 0.10,
        "health_within_1s": health["max_s"] is not None and health["max_s"] < 1.0 and health["not_200"] == 0,
        "registry_ok": registry == "ok",
        # uvicorn ends a SIGTERM'd server by raising the signal again once it has shut down cleanly
        "clean_exit": code in (0, -signal.SIGTERM) and not left,
    }
    row = {"streams": a.streams, "seconds": a.seconds, "requests": len(results), **counts, "cut_off": cut_off,
           "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None, "ttft_max_s": ttfts[-1] if ttfts else None,
           "health_max_s": health["max_s"], "rss_growth_%": None if rss.get("growth") is None else 100 * rss["growth"],
           "drain_s": drain_s}
    print_table([row], list(row))
    print("targets:", ", ".join(f"{k}={'met' if v else 'MISSED'}" for k, v in targets.items()))
    for e, n in sorted(errors.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {n} x {e}")
    path = write_result("soak", {
        "host_cpu": cpu_model(), "args": {k: v for k, v in vars(a).items()}, "summary": row, "targets": targets,
        "errors": errors, "rss": rss, "health": health, "gauges_after": drained, "registry": registry,
        "exit_code": code, "pids_left": left,
        "log_tail": log_tail if not all(targets.values()) else None,
    })
    print(f"wrote {path}")
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
