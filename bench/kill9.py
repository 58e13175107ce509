"""kill -9 under load (issue 51): `mlxr serve --api-servers 2` with MLXR_ENGINE_PROCESS=1 and a
KV disk tier, `--streams` streamed chat requests open, then SIGKILL of

- the engine core of the chat model (`--scenario core`): the supervisor starts it again, so the
  server must recover (new requests succeed) and stop cleanly on SIGTERM afterwards;
- one API process (`--scenario api`): the supervisor stops the server (exit status 1);
- the engine core again and again (`--scenario restarts`), once more than the supervisor
  restarts it within its window: the server must then exit with a status.

Either way every client must get its error within --within seconds of the kill, or keep
receiving its stream to the end (the surviving API process drains its streams), never waiting
longer than --within seconds for news; a request sent right after the kill must be answered as fast;
no process of the server's tree may be left once it has exited; the registry passes SQLite's
integrity_check, the disk tier's index its quick_check and every block file the tier's header
check. Writes results/<day>/kill9-<stamp>.json; non-zero exit on a missed promise.

    PYTHONPATH=$PWD .venv/bin/python bench/kill9.py            # both scenarios, 32 streams"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from common import cpu_model, print_table, write_result
from soak_parts import (
    CHAT_MODEL, PROMPTS, HealthProbe, Server, children_running, health_status, kv_disk_check, registry_check, start_server,
    still_alive, stop_server, stream_chat, tree,
)

CORE_MODULE = "mlxr.engine.core.core_proc"
API_MODULE = "mlxr.server.api_worker"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=("core", "api", "restarts", "all"), default="all")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=400, help="long enough that the streams are open at the kill")
    p.add_argument("--within", type=float, default=20.0,
                   help="seconds after the kill within which an error must come, and the longest a stream may go silent")
    p.add_argument("--recover", type=float, default=180.0, help="seconds allowed for /health to be 200 again")
    p.add_argument("--exit-within", type=float, default=90.0, help="seconds allowed for the server to exit")
    p.add_argument("--api-servers", type=int, default=2,
                   help="1: one server process with its cores as children (the api scenario kills it)")
    p.add_argument("--model", default=CHAT_MODEL)
    p.add_argument("--seed", type=int, default=9)
    p.add_argument("--start-timeout", type=float, default=400.0)
    return p.parse_args(argv)


def chat_core(server: Server, model: str) -> int:
    """The pid of the model's engine core: the supervisor starts one per preloaded model, in the
    order of the bundled models, and logs their pids in that order."""
    from mlxr.bundled_models import BUNDLED

    served = [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]
    names = [n for n in BUNDLED if n in served]
    found = re.search(r"engine cores \(pids \[([0-9, ]+)\]\)", server.log_path.read_text(errors="replace"))
    # one API process (no supervisor): it starts the cores one after the other, in the same order
    pids = [int(p) for p in found[1].split(",")] if found else children_running(server.proc.pid, CORE_MODULE)
    if len(pids) != len(names) or model not in names:
        raise RuntimeError(f"cannot tell which of the engine cores {pids} serves {model} (models {served})")
    return pids[names.index(model)]


async def load_and_kill(a: argparse.Namespace, url: str, victim: int) -> dict:
    """Open the streams, SIGKILL victim once most have their first chunk, and time how each ends."""
    rng = random.Random(a.seed)
    first_chunks = [asyncio.Event() for _ in range(a.streams)]
    bound_s = a.within + 60  # the client's own bound: past `within` it counts as a hang, and ends anyway
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(stream_chat(session, url, {
            "model": a.model, "stream": True, "max_tokens": a.max_tokens, "temperature": 0.8,
            "messages": [{"role": "user", "content": rng.choice(PROMPTS) + " Then tell a long story."}]},
            None, 120 + bound_s, started=first_chunks[i])) for i in range(a.streams)]
        for _ in range(600):  # up to 120 s for every stream to be streaming (or over)
            if all(e.is_set() or t.done() for e, t in zip(first_chunks, tasks)):
                break
            await asyncio.sleep(0.2)
        open_at_kill = sum(not t.done() for t in tasks)
        streaming_at_kill = sum(e.is_set() and not t.done() for e, t in zip(first_chunks, tasks))
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        await asyncio.sleep(0.2)
        late = asyncio.create_task(stream_chat(session, url, {
            "model": a.model, "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]}, None, bound_s))
        done, pending = await asyncio.wait([*tasks, late], timeout=bound_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    results = [t.result() for t in tasks if t in done]
    ends = [r.ended - killed_at for r in results if r.ended >= killed_at]
    late_r = late.result() if late in done else None
    return {
        "killed_at": killed_at, "open_at_kill": open_at_kill, "streaming_at_kill": streaming_at_kill,
        "hung": len(pending) - (late not in done),
        "errors_after_kill": sum(r.kind == "failed" and r.ended >= killed_at for r in results),
        "finished_after_kill": sum(r.kind == "ok" and r.ended >= killed_at for r in results),
        "failed_before_kill": sum(r.kind == "failed" and r.ended < killed_at for r in results),
        "time_to_end_max_s": max(ends, default=None),
        # a stream the surviving API process keeps serving is not hung: the longest silence counts
        "longest_silence_s": max((r.longest_wait_after(killed_at) for r in results), default=None),
        "time_to_error_max_s": max((r.ended - killed_at for r in results
                                    if r.kind == "failed" and r.ended >= killed_at), default=None),
        "error_kinds": sorted({(r.error or "")[:100] for r in results if r.kind == "failed"}),
        "late_request": None if late_r is None else {
            "kind": late_r.kind, "error": late_r.error, "seconds": late_r.ended - late_r.started},
    }


def health_window(probe: HealthProbe, killed_at: float | None) -> dict:
    """What /health said around the kill: its slowest answer, and for how long it was not 200."""
    after = [(t, code) for t, code, _ in probe.samples if killed_at is not None and t >= killed_at]
    not_ok = [t for t, code in after if code != 200]
    return {**probe.figures(), "not_200_from_s": not_ok[0] - killed_at if not_ok else None,
            "not_200_until_s": not_ok[-1] - killed_at if not_ok else None}


def wait_healthy(url: str, within_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        if health_status(url, 2.0)[0] == 200:
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


async def new_requests_succeed(url: str, model: str, count: int = 3) -> list[str]:
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(stream_chat(session, url, {
            "model": model, "stream": True, "max_tokens": 16,
            "messages": [{"role": "user", "content": "Name a fruit."}]}, None, 120) for _ in range(count)))
    return [r.kind if r.kind == "ok" else f"failed: {r.error}" for r in results]


def run_scenario(a: argparse.Namespace, scenario: str, tmp: Path) -> dict:
    home, kv = tmp / f"home-{scenario}", tmp / f"kv-{scenario}"
    server = start_server(home, "--api-servers", str(a.api_servers), "--kv-cache-dir", str(kv),
                          env={"MLXR_ENGINE_PROCESS": "1"}, timeout_s=a.start_timeout)
    out: dict = {"scenario": scenario}
    pids: set[int] = set()
    try:
        pids = {p.pid for p in tree(server.proc.pid)}
        victim = chat_core(server, a.model) if scenario == "core" else \
            (children_running(server.proc.pid, API_MODULE) or [server.proc.pid])[0]
        out["tree"] = {"supervisor": server.proc.pid, "api": children_running(server.proc.pid, API_MODULE),
                       "cores": children_running(server.proc.pid, CORE_MODULE), "victim": victim}
        probe = HealthProbe(server.url)
        probe.start()
        try:
            out.update(asyncio.run(load_and_kill(a, server.url, victim)))
            if scenario == "core":
                out["recovered_in_s"] = wait_healthy(server.url, a.recover)
        finally:
            probe.stop()
        out["health"] = health_window(probe, out.get("killed_at"))
        if scenario == "core":
            out["new_requests"] = asyncio.run(new_requests_succeed(server.url, a.model)) \
                if out["recovered_in_s"] is not None else []
            pids |= {p.pid for p in tree(server.proc.pid)}
            out["exit_code"] = stop_server(server, grace_s=a.exit_within)
        else:
            try:
                out["exit_code"] = server.proc.wait(a.exit_within)
                out["exited_in_s"] = time.monotonic() - out["killed_at"]
            except Exception:  # noqa: BLE001 - a server that did not exit by itself: recorded, then stopped
                out["exit_code"] = None
                pids |= {p.pid for p in tree(server.proc.pid)}
                stop_server(server)
    finally:
        pids |= {p.pid for p in tree(server.proc.pid)}
        if server.proc.poll() is None:
            stop_server(server)
    return after_exit(a, scenario, out, server, pids, kv)


def after_exit(a: argparse.Namespace, scenario: str, out: dict, server: Server, pids: set[int], kv: Path) -> dict:
    """Once the server is gone: the processes of its tree left behind, and the integrity checks."""
    for _ in range(40):  # up to 10 s: a core whose parent is gone notices it within a step
        if not still_alive(sorted(pids)):
            break
        time.sleep(0.25)
    out["pids_left"] = left = still_alive(sorted(pids))
    for pid in left:  # ours: the bench started this tree; leave no process behind for the next run
        os.kill(pid, signal.SIGKILL)
    out["registry"] = registry_check(server.home)
    check = kv_disk_check(kv)
    out["kv_disk"] = {"index": check.index, "block_files": check.block_files, "bad_files": check.bad_files[:20]}
    out["promises"] = promises(a, scenario, out, check.ok)
    if not all(out["promises"].values()):
        out["log_tail"] = server.log_path.read_text(errors="replace")[-6000:]
    return out


def run_restarts(a: argparse.Namespace, tmp: Path) -> dict:
    """The chat core killed under load once more than the supervisor restarts it within its
    window (supervisor.MAX_CORE_RESTARTS): the server must then exit with a status, leaving nothing."""
    from mlxr.server.supervisor import MAX_CORE_RESTARTS

    home, kv = tmp / "home-restarts", tmp / "kv-restarts"
    server = start_server(home, "--api-servers", str(a.api_servers), "--kv-cache-dir", str(kv),
                          env={"MLXR_ENGINE_PROCESS": "1"}, timeout_s=a.start_timeout)
    out: dict = {"scenario": "restarts", "kills": []}
    pids = {p.pid for p in tree(server.proc.pid)}
    try:
        victim = chat_core(server, a.model)
        others = set(children_running(server.proc.pid, CORE_MODULE)) - {victim}
        for i in range(MAX_CORE_RESTARTS + 1):
            if i and wait_healthy(server.url, a.recover) is None:
                out["kills"].append({"error": "not healthy again before the kill"})
                break
            if i:
                victim = (set(children_running(server.proc.pid, CORE_MODULE)) - others).pop()
            pids |= {p.pid for p in tree(server.proc.pid)}
            out["kills"].append({"victim": victim, **asyncio.run(load_and_kill(a, server.url, victim))})
        try:
            out["exit_code"] = server.proc.wait(a.exit_within)
        except Exception:  # noqa: BLE001 - a server that did not exit by itself: recorded, then stopped
            out["exit_code"] = None
    finally:
        pids |= {p.pid for p in tree(server.proc.pid)}
        if server.proc.poll() is None:
            stop_server(server)
    last = out["kills"][-1] if out["kills"] else {}
    out.update({k: last.get(k) for k in ("open_at_kill", "errors_after_kill", "finished_after_kill", "hung",
                                         "longest_silence_s", "time_to_error_max_s", "late_request")})
    out["every_kill_errored_in_time"] = all(k.get("time_to_error_max_s") is not None
                                            and k["time_to_error_max_s"] <= a.within for k in out["kills"])
    return after_exit(a, "restarts", out, server, pids, kv)


def promises(a: argparse.Namespace, scenario: str, out: dict, kv_ok: bool) -> dict[str, bool]:
    late = out.get("late_request") or {}
    p = {
        "streams_open_at_kill": out.get("open_at_kill", 0) > 0,
        "clients_saw_errors": out.get("errors_after_kill", 0) > 0,
        "errors_within_seconds": out.get("time_to_error_max_s") is None or out["time_to_error_max_s"] <= a.within,
        "no_client_hangs": out.get("hung", 1) == 0 and out.get("longest_silence_s") is not None
        and out["longest_silence_s"] <= a.within,
        "late_request_answered": bool(late) and late["seconds"] <= a.within,
        "no_processes_left": not out["pids_left"],
        "registry_ok": out["registry"] == "ok",
        "kv_disk_ok": kv_ok,
    }
    if scenario == "core":
        p["recovered"] = out.get("recovered_in_s") is not None and out.get("new_requests") == ["ok"] * 3
        p["clean_exit_after"] = out.get("exit_code") in (0, -signal.SIGTERM)
    else:
        p["exited_with_status"] = out.get("exit_code") is not None and out["exit_code"] != 0
    if scenario == "restarts":
        p["every_kill_errored_in_time"] = out["every_kill_errored_in_time"]
    return p


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    scenarios = ["core", "api", "restarts"] if a.scenario == "all" else [a.scenario]
    if a.api_servers == 1 and "restarts" in scenarios:
        scenarios.remove("restarts")  # no supervisor: nothing restarts the core
    with tempfile.TemporaryDirectory(prefix="mlxr-kill9-") as tmp:
        runs = [run_restarts(a, Path(tmp)) if s == "restarts" else run_scenario(a, s, Path(tmp)) for s in scenarios]
    rows = [{"scenario": r["scenario"], "open": r.get("open_at_kill"), "errors": r.get("errors_after_kill"),
             "finished": r.get("finished_after_kill"), "hung": r.get("hung"), "silence_max_s": r.get("longest_silence_s"),
             "to_error_max_s": r.get("time_to_error_max_s"), "late_s": (r.get("late_request") or {}).get("seconds"),
             "recovered_s": r.get("recovered_in_s"), "exit": r.get("exit_code"), "left": len(r["pids_left"]),
             "registry": r["registry"], "kv_files": r["kv_disk"]["block_files"]} for r in runs]
    print_table(rows, list(rows[0]))
    ok = True
    for r in runs:
        missed = [k for k, v in r["promises"].items() if not v]
        ok = ok and not missed
        print(f"{r['scenario']}: " + ("all promises kept" if not missed else f"MISSED {', '.join(missed)}"))
    path = write_result("kill9" if a.api_servers > 1 else "kill9-one-api", {"host_cpu": cpu_model(), "args": vars(a), "runs": runs})
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
