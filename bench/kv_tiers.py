"""KV cache tiers: a ~4,000-token shared system prompt, then a question.

Disk tier (real processes): `mlxr serve --kv-cache-dir D` answers the prompt cold (streamed,
TTFT at the first text), is stopped (SIGTERM), a new server starts on the same directory and
answers again: TTFT against the cold one (target <= 30%), greedy text identical. Then the prompt
once more on the restarted server, from its device cache ("repeat": the floor no tier can beat),
and the restarted server's restore phases (host ms: disk read-ahead started, lookups waiting on
reads, flushes of the copies, and the start's preload of the disk's recent blocks into the device
cache, which --preload 0 turns off) and kernels compiled after its warm-up. With --prime each server
first answers a short unrelated prompt, so neither TTFT carries a first request's one-off costs.
Host tier (one process, LLM API): an engine with a small device cache answers the prompt, other
prompts churn the device cache until the prompt's blocks are evicted, the prompt comes again;
the same engine without the host tier recomputes it. TTFT ratio (target <= 40%), identical text;
then the prompt once more from the device cache (the floor), and the restore phases.
Rounds interleave the two sides. Writes bench/results/kv_tiers-*.json.

--model is a GGUF file or model directory, a bundled model's name, or a mlxr.testing fixture's
name (built under .fixtures/); the in-process engines and the servers all load that one path.

  python bench/kv_tiers.py --device cpu
  python bench/kv_tiers.py --device cuda --rounds 3 --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
  python bench/kv_tiers.py --device cuda --rounds 3 --model tinyllama-shape
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from common import cpu_model, device_name, median, print_table, write_result  # noqa: E402
from server_harness import server_process  # noqa: E402

QUESTION = "\n\nQuestion: which tool turns a city name into its current weather, and what does it return?\nAnswer:"


def system_prompt(tokenizer, target: int, topic: str = "tool") -> str:
    """An agent's tool list, line after line, until it is `target` tokens long."""
    lines, i = [f"You are an assistant with these {topic}s. Use them exactly as documented.\n"], 0
    while len(tokenizer.encode("".join(lines))) < target:
        lines.append(f"- {topic}_{i}: takes a {['city', 'date', 'number', 'file', 'query'][i % 5]} "
                     f"argument named arg_{i} and returns a JSON object with fields f{i}a, f{i}b and "
                     f"status; errors come back as code {400 + i % 100}.\n")
        i += 1
    return "".join(lines)


# --- disk tier: servers -------------------------------------------------------------------------
def stream_ttft(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> tuple[float, str]:
    """TTFT of one streamed completion on the client's open connection: a new httpx client per
    request spends ~15 ms building its TLS context before it sends, which is the client's cost,
    not the server's (real clients keep one)."""
    model = client.get(url + "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    first, text = None, []
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            piece = json.loads(line[6:])["choices"][0]["text"]
            if piece and first is None:
                first = time.perf_counter() - t0
            text.append(piece)
    return first, "".join(text)


PRIME = "Say hello."


def disk_round(model: str, device: str, prompt: str, max_tokens: int, max_model_len: int, work: Path,
               prime: bool, preload: float | None = None) -> dict:
    cache = work / "kv"
    args = ("--model", model, "--device", device, "--kv-cache-dir", str(cache), "--max-model-len", str(max_model_len))
    if preload is not None:
        args += ("--kv-cache-preload", str(preload))
    times, stats = {}, {}
    for phase in ("cold", "restart"):
        with server_process(work / f"home-{phase}", *args, timeout_s=600) as (url, _), httpx.Client() as client:
            if prime:
                stream_ttft(client, url, PRIME, 4)
            times[phase] = stream_ttft(client, url, prompt, max_tokens)
            stats[phase] = next(iter(client.get(url + "/admin/stats").json()["models"].values()))
            if phase == "restart":
                times["repeat"] = stream_ttft(client, url, prompt, max_tokens)
    (cold, cold_text), (warm, warm_text) = times["cold"], times["restart"]
    tiers = stats["restart"]["kv_tiers"]
    return {"cold_ttft_s": cold, "restart_ttft_s": warm, "ratio": warm / cold, "identical": cold_text == warm_text,
            "repeat_ttft_s": times["repeat"][0], "text": cold_text, "restart_disk": tiers.get("disk"),
            "restart_restore_ms": restore_ms(tiers),
            "runtime_compiles": {p: stats[p].get("runtime_compiles") for p in stats}}


def restore_ms(tiers: dict) -> dict[str, float]:
    """KVTiers.times (host microseconds by phase) in milliseconds."""
    return {k.removesuffix("_us") + "_ms": v / 1e3 for k, v in tiers.get("restore", {}).items()}


# --- host tier: one process ---------------------------------------------------------------------
def ttft(llm, rid: str, ids: list[int], max_tokens: int) -> tuple[float, list[int]]:
    from mlxr import SamplingParams

    engine = llm.engine
    engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    t0, first, tokens = time.perf_counter(), None, []
    while engine.has_unfinished():
        for out in engine.step():
            if first is None and out.outputs[0].token_ids:
                first = time.perf_counter() - t0
            if out.finished:
                tokens = out.outputs[0].token_ids
    return first, tokens


def host_round(llm, label: str, r: int, prompt: list[int], churn: list[list[int]], max_tokens: int) -> dict:
    _, cold_tokens = ttft(llm, f"{label}-{r}-cold", prompt, max_tokens)
    for i, c in enumerate(churn):
        ttft(llm, f"{label}-{r}-churn{i}", c, 1)
    before = dict(llm.engine.stats().kv_tiers.get("restore", {}))
    again, tokens = ttft(llm, f"{label}-{r}-again", prompt, max_tokens)
    after = llm.engine.stats().kv_tiers.get("restore", {})
    floor, _ = ttft(llm, f"{label}-{r}-repeat", prompt, max_tokens)
    return {"ttft_s": again, "repeat_ttft_s": floor, "identical": tokens == cold_tokens, "tokens": tokens,
            "restore_ms": restore_ms({"restore": {k: v - before.get(k, 0) for k, v in after.items()}})}


def host_side(args, tokenizer, prompt_text: str) -> dict:
    import torch

    from mlxr import LLM

    prompt = tokenizer.encode(prompt_text)
    blocks = -(-(len(prompt) + args.max_tokens) // 16) + 16
    # Churn of more tokens than the device holds: every block of the prompt is evicted.
    churn = [tokenizer.encode(system_prompt(tokenizer, blocks * 16 // 2 + 64, topic)) for topic in ("sensor", "recipe")]
    kw = dict(device=args.device, num_kv_blocks=blocks, max_model_len=blocks * 16)
    with_host = LLM(args.model_path, kv_host_cache_gb=args.host_gb, **kw)
    recompute = LLM(args.model_path, **kw)
    rows = {"host": [], "recompute": []}
    for r in range(args.rounds):
        rows["host"].append(host_round(with_host, "host", r, prompt, churn, args.max_tokens))
        rows["recompute"].append(host_round(recompute, "recompute", r, prompt, churn, args.max_tokens))
    tiers = with_host.engine.stats().kv_tiers
    for llm in (with_host, recompute):
        llm.shutdown()
        del llm
    if args.device == "cuda":
        torch.cuda.empty_cache()
    host_t = median([x["ttft_s"] for x in rows["host"]])
    re_t = median([x["ttft_s"] for x in rows["recompute"]])
    same = all(h["tokens"] == c["tokens"] for h, c in zip(rows["host"], rows["recompute"]))
    return {"device_blocks": blocks, "prompt_tokens": len(prompt), "churn_tokens": [len(c) for c in churn],
            "host_ttft_s": host_t, "recompute_ttft_s": re_t, "ratio": host_t / re_t, "target": 0.4,
            "repeat_ttft_s": median([x["repeat_ttft_s"] for x in rows["host"]]),
            "identical": same and all(x["identical"] for v in rows.values() for x in v), "rounds": rows,
            "host_tier": tiers.get("host")}


def restore_rows(result: dict) -> list[tuple[str, dict]]:
    out = []
    if "disk" in result:
        out.append(("disk", [x["restart_restore_ms"] for x in result["disk"]["rounds"]]))
    if "host" in result:
        out.append(("host", [x["restore_ms"] for x in result["host"]["rounds"]["host"]]))
    return [(name, {k: round(median([r.get(k, 0.0) for r in runs]), 2) for k in runs[0]}) for name, runs in out if runs]


def resolve_model(ref: str) -> str:
    """The one path every engine here loads: a GGUF file or model directory as given, a bundled
    model's GGUF file, or a mlxr.testing fixture's HF directory (written once under .fixtures/)."""
    from mlxr.bundled_models import BUNDLED_REFS, bundled_path

    if Path(ref).exists():
        return str(Path(ref).resolve())
    if ref in BUNDLED_REFS:
        return str(bundled_path(ref))
    from mlxr.testing.fixtures import CONFIGS, fixture_paths

    if ref in CONFIGS:
        return str(fixture_paths(ref, ROOT / ".fixtures").hf_dir)
    raise SystemExit(f"--model {ref!r}: no such file or directory, and not a bundled model "
                     f"({', '.join(sorted(BUNDLED_REFS))}) or a fixture ({', '.join(sorted(CONFIGS))})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="gemma3-270m", help="GGUF file, model directory, bundled or fixture name")
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--host-gb", type=float, default=2.0)
    ap.add_argument("--skip", choices=["disk", "host"], default=None)
    ap.add_argument("--prime", action="store_true", help="disk tier: a short prompt first on each server")
    ap.add_argument("--preload", type=float, default=None,
                    help="disk tier: the servers' --kv-cache-preload (default: theirs; 0 = restore on request)")
    args = ap.parse_args()
    from mlxr.loader import load_frontend

    args.model_path = model_path = resolve_model(args.model)
    _, _, tokenizer = load_frontend(model_path)
    text = system_prompt(tokenizer, args.prompt_tokens) + QUESTION
    prompt_tokens = len(tokenizer.encode(text))
    result = {"device": device_name(args.device), "cpu": cpu_model(), "cpus": os.cpu_count(),
              "model": args.model, "model_path": model_path, "prompt_tokens": prompt_tokens}
    max_model_len = prompt_tokens + args.max_tokens + 64  # past a fixture's 2,048 positions too
    if args.skip != "disk":
        rounds = []
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="kv-tiers-bench-") as work:
                rounds.append(disk_round(model_path, args.device, text, args.max_tokens, max_model_len, Path(work),
                                         args.prime, args.preload))
        cold, warm = median([x["cold_ttft_s"] for x in rounds]), median([x["restart_ttft_s"] for x in rounds])
        result["disk"] = {"cold_ttft_s": cold, "restart_ttft_s": warm, "ratio": warm / cold, "target": 0.3,
                          "primed": args.prime, "preload": args.preload,
                          "repeat_ttft_s": median([x["repeat_ttft_s"] for x in rounds]),
                          "identical": all(x["identical"] for x in rounds), "rounds": rounds}
    if args.skip != "host":
        result["host"] = host_side(args, tokenizer, text)
    rows = [{"tier": k, "fast_ttft_s": f"{v.get('restart_ttft_s', v.get('host_ttft_s')):.3f}",
             "slow_ttft_s": f"{v.get('cold_ttft_s', v.get('recompute_ttft_s')):.3f}", "ratio": f"{v['ratio']:.3f}",
             "target": v["target"], "identical": v["identical"], "repeat_ttft_s": f"{v['repeat_ttft_s']:.3f}"}
            for k, v in result.items() if k in ("disk", "host")]
    print_table(rows, ["tier", "fast_ttft_s", "slow_ttft_s", "ratio", "target", "identical", "repeat_ttft_s"])
    for name, phases in restore_rows(result):
        print(f"{name} restore phases (host ms, median of rounds): {phases}")
    print(write_result("kv_tiers", result))


if __name__ == "__main__":
    main()
