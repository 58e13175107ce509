"""Long prompts, MLXR through `mlxr serve` beside llama.cpp on the same GGUF, interleaved:

- prefill of N tokens (--lengths, those that fit the model's context): MLXR's TTFT of an
  N-token streamed /v1/completions (prefill_tok_s = N / TTFT) beside llama-bench `-p N -n 0`;
- decode at N tokens of context: the same stream's tokens after its first over the time
  after the first (decode_tok_s) beside llama-bench `-p 0 -d N -n --gen`;
- fairness: the TTFT of a --short-len prompt sent --short-delay s after a --long-len one, and
  the long one's TTFT alone and with the short one, on `mlxr serve` (its defaults) and on
  llama-server with two slots (`-np 2`);
- the Open WebUI case: a first chat of ~--chat-tokens tokens (a system prompt of tool schemas)
  through /v1/chat/completions on both servers: time to the first streamed token.

Every prompt is fresh (random ids, or a nonce first in the chat), so no prefix cache serves it.
The CPU is named and the 1-minute load average recorded beside every figure (a shared host
moves both engines: read the ratios). JSON to bench/results/<day>/long_context-*.json.

  python bench/long_context.py --model smollm2:135m --lengths 1024 4096 8192
  python bench/long_context.py --model gemma3-270m --lengths 1024 4096 8192 16384 32768
  python bench/long_context.py --model x.gguf --device cuda --llama-bin ~/llama.cpp/build/bin
  python bench/long_context.py --parts fairness webui   # only those
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

import bench_folders  # noqa: F401,I001  (bench/peers on sys.path)
from common import cpu_model, print_table, write_result
from llama_server import LlamaServer

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("prefill", "fairness", "webui")
LLAMA_BIN = "/work/lcpp/llama.cpp/build-cpu/bin"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def gguf_path(model: str) -> str:
    if Path(model).exists():
        return str(Path(model).resolve())
    from mlxr.loader.resolve import resolve_model

    return str(resolve_model(model).path)


def context_length(path: str) -> int:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    for name, field in reader.fields.items():
        if name.endswith(".context_length"):
            return int(field.parts[field.data[0]][0])
    raise SystemExit(f"{path}: no context_length in its metadata")


def random_ids(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(100, 30000) for _ in range(n)]


# --- one streamed request --------------------------------------------------------------------
def stream(url: str, path: str, body: dict, timeout: float = 1800.0) -> dict:
    """Send a streamed request; its send time, first and last token times, tokens and usage."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    out = {"sent": time.perf_counter(), "first": None, "last": None, "chunks": 0, "usage": None}
    with httpx.stream("POST", url + path, json=body, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            choice = (obj.get("choices") or [None])[0]
            text = choice and (choice.get("text") or (choice.get("delta") or {}).get("content")
                               or (choice.get("delta") or {}).get("reasoning_content"))
            if text:
                now = time.perf_counter()
                out["first"] = out["first"] or now
                out["last"] = now
                out["chunks"] += 1
            if obj.get("usage"):
                out["usage"] = obj["usage"]
    out["ttft_s"] = out["first"] - out["sent"] if out["first"] else None
    return out


def completion(model: str, ids: list[int], gen: int) -> dict:
    return {"model": model, "prompt": ids, "max_tokens": gen, "temperature": 0.0, "ignore_eos": True}


# --- the servers -----------------------------------------------------------------------------
class MlxrServer:
    """`mlxr serve` on the GGUF at a free port, a fresh home, its default scheduling."""

    def __init__(self, a: argparse.Namespace, path: str, ctx: int) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        from server_harness import server_process

        self._home = tempfile.TemporaryDirectory(prefix="mlxr-long-")
        flags = ["--model", path, "--device", a.device, "--max-model-len", str(ctx), "--kv-cache-gb",
                 str(a.kv_cache_gb), *a.mlxr_flag]
        self._cm = server_process(Path(self._home.name), *flags, timeout_s=600)

    def __enter__(self) -> MlxrServer:
        self.url, _ = self._cm.__enter__()
        self.model = httpx.get(self.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        return self

    def __exit__(self, *exc) -> None:
        self._cm.__exit__(*exc)
        self._home.cleanup()


def llama_server(a: argparse.Namespace, path: str, ctx: int) -> LlamaServer:
    # Two slots sharing one cache (-kvu) of room for both prompts at once.
    return LlamaServer(str(Path(a.llama_bin) / "llama-server"), path, a.device == "cuda", a.threads,
                       2 * ctx, ["-np", "2", "-kvu", "-b", "2048", "-ub", "512"])


def llama_bench(a: argparse.Namespace, path: str, args: list[str]) -> float:
    """llama-bench's tokens/s for one test (-r --runs), its JSON output."""
    argv = [str(Path(a.llama_bin) / "llama-bench"), "-m", path, "-t", str(a.threads), "-r", str(a.runs),
            "-ngl", "99" if a.device == "cuda" else "0", "-o", "json", *args]
    run = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=3600)
    return float(json.loads(run.stdout)[0]["avg_ts"])


# --- the parts -------------------------------------------------------------------------------
def prefill_and_decode(a, path: str, mlxr: MlxrServer, lengths: list[int], rng) -> list[dict]:
    rows = []
    for n in lengths:
        for run in range(a.runs):
            before = load()
            s = stream(mlxr.url, "/v1/completions", completion(mlxr.model, random_ids(n, rng), a.gen))
            tokens = s["usage"]["completion_tokens"] if s["usage"] else s["chunks"]
            rows.append({"part": "prefill+decode", "engine": "mlxr", "tokens": n, "run": run,
                         "prefill_tok_s": n / s["ttft_s"], "ttft_s": s["ttft_s"],
                         "decode_tok_s": (tokens - 1) / (s["last"] - s["first"]), "load": [before, load()]})
        if a.llama_bin and (a.peer_lengths is None or n in a.peer_lengths):
            before = load()
            pp = llama_bench(a, path, ["-p", str(n), "-n", "0"])
            tg = llama_bench(a, path, ["-p", "0", "-n", str(a.gen), "-d", str(n)])
            rows.append({"part": "prefill+decode", "engine": "llama.cpp", "tokens": n, "prefill_tok_s": pp,
                         "decode_tok_s": tg, "load": [before, load()]})
        print_rows([r for r in rows if r["tokens"] == n])
    return rows


def behind_a_long_prompt(a, url: str, model: str, engine: str, rng) -> list[dict]:
    """The long prompt alone, then with the short one sent --short-delay s after it."""
    long_alone = stream(url, "/v1/completions", completion(model, random_ids(a.long_len, rng), 1))
    got: dict = {}
    before = load()
    worker = threading.Thread(target=lambda: got.update(
        long=stream(url, "/v1/completions", completion(model, random_ids(a.long_len, rng), 1))))
    worker.start()
    time.sleep(a.short_delay)
    short = stream(url, "/v1/completions", completion(model, random_ids(a.short_len, rng), 16))
    worker.join()
    row = {"part": "fairness", "engine": engine, "tokens": a.long_len, "long_ttft_alone_s": long_alone["ttft_s"],
           "long_ttft_with_short_s": got["long"]["ttft_s"], "short_ttft_s": short["ttft_s"],
           "long_growth": got["long"]["ttft_s"] / long_alone["ttft_s"], "load": [before, load()]}
    print_rows([row])
    return [row]


def tool_schemas(count: int, nonce: str) -> str:
    """A system prompt as Open WebUI's is: its instructions, then one JSON schema a tool."""
    words = ("search", "fetch", "read", "write", "list", "update", "create", "delete", "query", "convert")
    tools = [{"type": "function", "function": {
        "name": f"{words[i % 10]}_{words[(i * 3) % 10]}_{i}",
        "description": f"{words[i % 10].title()} the {words[(i * 7) % 10]} records of the user's workspace "
                       "and return them as a list of objects with their identifiers and titles.",
        "parameters": {"type": "object", "properties": {
            f"{words[(i + k) % 10]}_{k}": {"type": "string", "description": f"The {words[(i + k) % 10]} filter number {k}"}
            for k in range(6)}, "required": [f"{words[i % 10]}_0"]}}} for i in range(count)]
    return (f"Session {nonce}. You are a helpful assistant with these tools; call one when it helps.\n"
            + "\n".join(json.dumps(t) for t in tools))


def first_chat(a, url: str, model: str, engine: str, rng) -> list[dict]:
    system = tool_schemas(a.chat_tools, f"{rng.randrange(1 << 30):x}")
    body = {"model": model, "max_tokens": 16, "temperature": 0.0, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "What can you do for me?"}]}
    before = load()
    s = stream(url, "/v1/chat/completions", body)
    row = {"part": "webui", "engine": engine, "tokens": (s["usage"] or {}).get("prompt_tokens"),
           "ttft_s": s["ttft_s"], "load": [before, load()]}
    print_rows([row])
    return [row]


COLUMNS = ["part", "engine", "tokens", "prefill_tok_s", "decode_tok_s", "ttft_s", "short_ttft_s",
           "long_ttft_alone_s", "long_ttft_with_short_s", "long_growth", "load"]


def print_rows(rows: list[dict]) -> None:
    print_table(rows, COLUMNS)
    sys.stdout.flush()


def ratios(rows: list[dict]) -> list[dict]:
    """MLXR / llama.cpp per part and length (medians of MLXR's runs); TTFTs as llama.cpp / MLXR."""
    out = []
    for n in sorted({r["tokens"] for r in rows if r["part"] == "prefill+decode"}):
        ours = [r for r in rows if r["part"] == "prefill+decode" and r["tokens"] == n and r["engine"] == "mlxr"]
        peer = [r for r in rows if r["part"] == "prefill+decode" and r["tokens"] == n and r["engine"] == "llama.cpp"]
        if ours and peer:
            med = lambda key: sorted(r[key] for r in ours)[len(ours) // 2]  # noqa: E731
            out.append({"tokens": n, "prefill_x": med("prefill_tok_s") / peer[0]["prefill_tok_s"],
                        "decode_x": med("decode_tok_s") / peer[0]["decode_tok_s"]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2:135m", help="a bundled model's name or a GGUF path")
    p.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096, 8192, 16384, 32768])
    p.add_argument("--gen", type=int, default=32, help="tokens decoded at each context")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (MLXR takes every usable CPU)")
    p.add_argument("--llama-bin", default=LLAMA_BIN, help="llama.cpp's bin folder (llama-bench, llama-server); "
                                                           "empty: MLXR alone")
    p.add_argument("--peer-lengths", type=int, nargs="*", default=None,
                   help="the lengths llama-bench runs at (default: every one of --lengths)")
    p.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS))
    p.add_argument("--long-len", type=int, default=8192)
    p.add_argument("--short-len", type=int, default=16)
    p.add_argument("--short-delay", type=float, default=1.0)
    p.add_argument("--chat-tools", type=int, default=36, help="tool schemas in the chat's system prompt (~6.6k tokens)")
    p.add_argument("--kv-cache-gb", type=float, default=4.0)
    p.add_argument("--mlxr-flag", action="append", default=[], help="one more `mlxr serve` argument (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    path = gguf_path(a.model)
    ctx = context_length(path)
    lengths = [n for n in a.lengths if n + a.gen <= ctx]
    a.long_len = min(a.long_len, ctx - 64)
    need = max([*lengths, a.long_len + a.short_len + 64, 8192]) + a.gen
    rng = random.Random(a.seed)
    rows: list[dict] = []
    with MlxrServer(a, path, min(ctx, need)) as mlxr:
        stream(mlxr.url, "/v1/completions", completion(mlxr.model, random_ids(64, rng), 4))  # first use
        if "prefill" in a.parts:
            rows += prefill_and_decode(a, path, mlxr, lengths, rng)
        peer = llama_server(a, path, min(ctx, need)) if a.llama_bin and set(a.parts) - {"prefill"} else None
        with peer or _Nothing():
            if peer:
                stream(peer.url, "/v1/completions", completion("x", random_ids(64, rng), 4))
            if "fairness" in a.parts:
                rows += behind_a_long_prompt(a, mlxr.url, mlxr.model, "mlxr", rng)
                if peer:
                    rows += behind_a_long_prompt(a, peer.url, "x", "llama.cpp", rng)
            if "webui" in a.parts:
                rows += first_chat(a, mlxr.url, mlxr.model, "mlxr", rng)
                if peer:
                    rows += first_chat(a, peer.url, "x", "llama.cpp", rng)
    summary = ratios(rows)
    print_rows(rows)
    if summary:
        print_table(summary, ["tokens", "prefill_x", "decode_x"])
    out = write_result("long_context", {"model": a.model, "gguf": path, "context_length": ctx, "device": a.device,
                                        "cpu": cpu_model(), "cpus": os.cpu_count(), "threads": a.threads,
                                        "llama_bin": a.llama_bin, "args": vars(a), "rows": rows, "ratios": summary})
    print(f"wrote {out}")


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


if __name__ == "__main__":
    main()
