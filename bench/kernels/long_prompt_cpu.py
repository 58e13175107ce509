"""Long prompts on the CPU through the engine (LLM API, 2 threads): prefill time per token at
each prompt length and decode tok/s at that context, for this tree beside an older one (the
"before"; default /work/main), the two alternating in one session on one CPU so that their
ratio holds on a shared host. Per-token growth is the figure: prefill ms/token at the longest
length over that at the shortest (issue 43's target: at most 1.5 at 8k against 512).

  python bench/kernels/long_prompt_cpu.py --old /work/main --lengths 512,2048,4096,8000
  python bench/kernels/long_prompt_cpu.py --one smollm2:135m --lengths 512   # one tree, in-process
  ... --llama-bench /work/lcpp/llama.cpp/build-cpu/bin/llama-bench   # llama.cpp in each round too

With --llama-bench, each round also runs llama.cpp's llama-bench on the same GGUF file, same
threads (-p at the lengths for prefill, -d at them for decode of --gen-len tokens), so the
peer's figures come from the same minutes of the same host.

Each length is a fresh random prompt (no prefix-cache hits), then --gen-len greedy tokens.
Writes bench/results/<day>/long_prompt_cpu-<stamp>.json."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import bench_path  # noqa: F401  (puts bench/ on sys.path)
from common import cpu_model, print_table, write_result

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("smollm2:135m", "gemma3-270m")


def measure(model: str, lengths: list[int], gen: int, threads: int) -> list[dict]:
    """In this process, with the tree on sys.path: one row per prompt length."""
    import torch

    from mlxr import LLM, SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(model, max_num_seqs=1)
    vocab = llm.args.vocab_size
    rows = []
    params = SamplingParams(max_tokens=gen, temperature=0.0, ignore_eos=True)
    for i, n in enumerate([lengths[0], *lengths]):  # the first run warms up (kernel builds, graphs)
        ids = torch.randint(10, vocab - 10, (n,), generator=torch.Generator().manual_seed(n + i)).tolist()
        engine = llm.engine
        engine.add_request(f"long-{i}", ids, params, stream_deltas=True)
        t0 = time.perf_counter()
        first, got = None, 0
        while engine.has_unfinished():
            for out in engine.step():
                got += len(out.outputs[0].token_ids)
                if first is None and got:
                    first = time.perf_counter()
        t1 = time.perf_counter()
        if i:
            rows.append({"prompt_len": n, "prefill_s": first - t0, "prefill_ms_per_tok": (first - t0) / n * 1e3,
                         "decode_tok_s": (got - 1) / (t1 - first)})
    llm.shutdown()
    return rows


def run_tree(tree: Path, model: str, lengths: list[int], gen: int, threads: int) -> list[dict]:
    """This script's --one mode in a subprocess whose imports come from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    cmd = [sys.executable, __file__, "--one", model, "--lengths", ",".join(map(str, lengths)), "--gen-len", str(gen),
           "--threads", str(threads)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


def model_file(model: str) -> str:
    from mlxr.bundled_models import bundled_path

    return str(bundled_path(model))


def llama_bench(binary: str, model: str, lengths: list[int], gen: int, threads: int) -> list[dict]:
    """llama-bench's prompt (-p) and decode-at-depth (-d) figures, one row per length."""
    common = [binary, "-m", model_file(model), "-t", str(threads), "-r", "1", "-o", "json"]
    joined = ",".join(map(str, lengths))
    prompt = json.loads(subprocess.run([*common, "-p", joined, "-n", "0"], check=True, capture_output=True,
                                       text=True).stdout)
    decode = json.loads(subprocess.run([*common, "-p", "0", "-n", str(gen), "-d", joined], check=True,
                                       capture_output=True, text=True).stdout)
    pp = {r["n_prompt"]: r["avg_ts"] for r in prompt}
    tg = {r["n_depth"]: r["avg_ts"] for r in decode}
    return [{"prompt_len": n, "prefill_s": n / pp[n], "prefill_ms_per_tok": 1e3 / pp[n], "decode_tok_s": tg[n]}
            for n in lengths]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old", default="/work/main", help="the tree of the 'before' figures")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--lengths", default="512,2048,4096,8000")
    p.add_argument("--gen-len", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--llama-bench", help="llama.cpp's llama-bench binary: its figures in each round too")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one model in this process
    a = p.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.one:
        print(json.dumps(measure(a.one, lengths, a.gen_len, a.threads)))
        return
    trees = {"new": ROOT, "old": Path(a.old)}
    rows = []
    for r in range(a.rounds):
        for model in a.models.split(","):
            for name in (["new", "old"] if r % 2 == 0 else ["old", "new"]):  # alternate who goes first
                for row in run_tree(trees[name], model, lengths, a.gen_len, a.threads):
                    rows.append({"round": r, "model": model, "tree": name, **row})
            if a.llama_bench:
                for row in llama_bench(a.llama_bench, model, lengths, a.gen_len, a.threads):
                    rows.append({"round": r, "model": model, "tree": "llama.cpp", **row})
    for model in a.models.split(","):
        for name in [*trees, "llama.cpp"]:
            mine = [x for x in rows if x["model"] == model and x["tree"] == name]
            by_len = {x["prompt_len"]: x["prefill_ms_per_tok"] for x in mine}
            for x in mine:
                x["growth_vs_shortest"] = x["prefill_ms_per_tok"] / by_len[lengths[0]]
    for x in rows:
        if x["tree"] != "new":
            continue
        for peer, key in (("old", "vs_old"), ("llama.cpp", "vs_llama_cpp")):
            y = next((y for y in rows if y["tree"] == peer and y["round"] == x["round"] and y["model"] == x["model"]
                      and y["prompt_len"] == x["prompt_len"]), None)
            if y:
                x[f"prefill_{key}"] = y["prefill_ms_per_tok"] / x["prefill_ms_per_tok"]
                x[f"decode_{key}"] = x["decode_tok_s"] / y["decode_tok_s"]
    meta = {"cpu": cpu_model(), "threads": a.threads, "host": "shared with other sessions' work (ratios, not absolutes)",
            "load_avg": os.getloadavg(), "old_tree": str(a.old), "gen_len": a.gen_len,
            "ratios": "x_vs_y > 1: this tree faster (prefill per token, decode tok/s)"}
    path = write_result("long_prompt_cpu", {**meta, "results": rows})
    print_table(rows, ["round", "model", "tree", "prompt_len", "prefill_s", "prefill_ms_per_tok", "growth_vs_shortest",
                       "decode_tok_s", "prefill_vs_old", "decode_vs_old", "prefill_vs_llama_cpp",
                       "decode_vs_llama_cpp"])
    print(f"{meta} -> {path}")


if __name__ == "__main__":
    main()
