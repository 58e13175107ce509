"""llama.cpp on this CPU, on the same GGUF files and lengths as bench/quant_cpu.py (128-token
prompt, 64 greedy tokens, 2 threads, median of --runs): the peer measured on the machine
at hand, for when it is not the machine BENCHMARKS.md's figures came from. JSON to
bench/results/llama_cpp_cpu-*.json.

llama-cpp-python is not a project dependency (it compiles llama.cpp); install it apart:
  python3 -m venv /tmp/lcpp && /tmp/lcpp/bin/pip install llama-cpp-python==0.3.36
  .venv/bin/python bench/peers/llama_cpp_cpu.py --site /tmp/lcpp/lib/python3.11/site-packages
"""
from __future__ import annotations

import argparse
import sys
import time

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import device_name, median, print_table, write_result
from latency import prompt_ids
from quant_cpu import model_file


def run_once(llm, prompt: list[int], gen: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of one fresh run: the prompt in one eval, then one eval a
    greedy token."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(gen):
        llm.eval([llm.sample(temp=0.0)])
    t2 = time.perf_counter()
    return len(prompt) / (t1 - t0), gen / (t2 - t1)


def bench(name: str, runs: int, threads: int) -> dict:
    from llama_cpp import Llama

    from mlxr.loader.resolve import resolve_model

    path = str(resolve_model(model_file(name)).path)
    llm = Llama(path, n_ctx=512, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    prompt = prompt_ids(llm.n_vocab(), 128)
    run_once(llm, prompt, 4)  # warm-up
    results = [run_once(llm, prompt, 64) for _ in range(runs)]
    return {"model": name, "prefill_tok_s": median([r[0] for r in results]),
            "decode_tok_s": median([r[1] for r in results]), "threads": threads}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="*", default=["gemma3-270m"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--site", default=None, help="site-packages holding llama_cpp (its own venv)")
    a = p.parse_args()
    if a.site:
        sys.path.append(a.site)  # after the project's own packages
    import llama_cpp

    rows = [bench(m, a.runs, a.threads) for m in a.models]
    path = write_result("llama_cpp_cpu", {"device": device_name("cpu"), "llama_cpp_python": llama_cpp.__version__,
                                          "prompt_len": 128, "gen_len": 64, "runs": a.runs, "models": rows})
    print_table(rows, ["model", "prefill_tok_s", "decode_tok_s", "threads"])
    print(path)


if __name__ == "__main__":
    main()
