"""llama.cpp's own n-gram speculation beside MLXR's, on the same GGUF (smollm2:135m Q4_1) and the
same input-grounded tasks as bench/spec_decode.py (bench/spec_tasks.py: text rewrites, code edits,
an agent's multi-turn session; the same prompt token ids), greedy, batch 1:
each engine with speculation off and on, interleaved (every round runs every task on every
engine and mode), median per task over the rounds.

Engines (any subset in one run):
  --server-bin PATH  llama-server twice (-np 1, fixed context), once plain and once with
                     `--spec-type ngram-simple` drafting k tokens; tok/s and drafts from the
                     server's own `timings` (predicted_per_second, draft_n, draft_n_accepted).
                     --gpu adds -ngl 99. Both servers are killed at the end (also on error).
  --python           llama-cpp-python on this CPU, plain and with LlamaPromptLookupDecoding
                     (num_pred_tokens = k); wall-clock tok/s.
  --mlxr DEVICE      MLXR with --speculative-method suffix and ngram (--mlxr-methods), requests
                     with speculative off / on.

gen_tok_s: generated tokens per second after the first token (the decode rate); e2e_tok_s:
tokens over the whole request (prefill included, no prefix cache; bench/spec_decode.py's
figure). Per task: medians over rounds, the median of each round's on/off ratio (the pair ran
back to back: the ratio that a shared machine's changing load disturbs least), the best run;
an engine's row: their means over tasks, and each task class's mean paired speedup. Each run
records the 1-minute load average.

  python bench/peers/llama_spec.py --python --mlxr cpu --threads 2                 (CPU)
  python bench/peers/llama_spec.py --server-bin B/llama-server --gpu --mlxr cuda   (GPU)
Writes bench/results/<day>/llama_spec-<stamp>.json."""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import cpu_model, device_name, print_table, write_result  # noqa: E402
from bench.peers.llama_server import LlamaServer  # noqa: E402
from bench.spec_tasks import TASK_CLASS, TASK_CLASSES, TASKS, chat_ids  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402
from mlxr.formats.gguf import open_gguf  # noqa: E402
from mlxr.tokenizer.tokenizer import Tokenizer  # noqa: E402


def run_record(tokens: list[int], t0: float, t_first: float, t_end: float, drafted: int = 0, accepted: int = 0) -> dict:
    n = len(tokens)
    gen = (n - 1) / (t_end - t_first) if n > 1 and t_end > t_first else float("nan")
    return {"tokens": tokens, "n": n, "e2e_tok_s": n / (t_end - t0), "gen_tok_s": gen,
            "drafted": drafted, "accepted": accepted}


class ServerEngine:
    """llama-server, one process per mode; the timings are the server's."""

    def __init__(self, args, stack: contextlib.ExitStack) -> None:
        self.name = "llama-server"
        common = {"binary": args.server_bin, "model": args.gguf, "gpu": args.gpu, "threads": args.threads,
                  "ctx": args.ctx}
        spec = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(args.server_ngram),
                "--spec-ngram-simple-size-m", str(args.k), "--spec-draft-n-max", str(args.k)]
        self.servers = {False: stack.enter_context(LlamaServer(**common, extra=[])),
                        True: stack.enter_context(LlamaServer(**common, extra=spec))}
        self.config = {"spec_args": spec, "server_argv": self.servers[True].argv}

    def run(self, ids: list[int], max_tokens: int, spec: bool) -> dict:
        t0 = time.perf_counter()
        body = self.servers[spec].complete(ids, max_tokens)
        wall = time.perf_counter() - t0
        t = body["timings"]
        rec = {"tokens": body.get("tokens", []), "n": t["predicted_n"], "gen_tok_s": t["predicted_per_second"],
               "e2e_tok_s": t["predicted_n"] / ((t["prompt_ms"] + t["predicted_ms"]) / 1e3), "wall_s": wall,
               "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}
        return rec


class PythonEngine:
    """llama-cpp-python in this process: a plain Llama and one with prompt-lookup drafting."""

    def __init__(self, args, stop_ids: frozenset[int]) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.name, self.stop_ids = "llama-cpp-python", stop_ids
        kw = {"n_ctx": args.ctx, "n_threads": args.threads, "n_threads_batch": args.threads, "n_batch": 512,
              "verbose": False, "n_gpu_layers": 99 if args.gpu else 0}
        draft = LlamaPromptLookupDecoding(max_ngram_size=args.python_ngram, num_pred_tokens=args.k)
        self.draft = draft
        self.llms = {False: llama_cpp.Llama(args.gguf, **kw), True: llama_cpp.Llama(args.gguf, draft_model=draft, **kw)}
        self.config = {"llama_cpp_python": llama_cpp.__version__, "max_ngram_size": args.python_ngram,
                       "num_pred_tokens": args.k}

    def run(self, ids: list[int], max_tokens: int, spec: bool) -> dict:
        llm = self.llms[spec]
        llm.reset()  # no prefix reuse from the previous run: every run prefills the same
        evals, drafted = self._count(llm)
        tokens: list[int] = []
        t0 = time.perf_counter()
        t_first = None
        for tok in llm.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
            t_first = t_first or time.perf_counter()
            if tok in self.stop_ids:
                break
            tokens.append(int(tok))
            if len(tokens) >= max_tokens:
                break
        t_end = time.perf_counter()
        # the prompt's eval yields the first token; each later one verifies a step's drafts and
        # yields the kept ones + 1: kept = tokens - evals (approximate where max_tokens cut a step)
        accepted = max(0, len(tokens) - len(evals)) if spec else 0
        return run_record(tokens, t0, t_first, t_end, sum(drafted), min(accepted, sum(drafted)))

    def _count(self, llm) -> tuple[list, list]:
        """Record this run's evals and draft lengths on the instance (the class's own methods
        do the work)."""
        evals, drafted = [], []
        eval_fn = type(llm).eval
        llm.eval = lambda tokens: (evals.append(len(tokens)), eval_fn(llm, tokens))[1]
        if llm.draft_model is not None:
            llm.draft_model = _Counting(self.draft, drafted)
        return evals, drafted


class _Counting:
    """A draft model that notes how many tokens each call drafted."""

    def __init__(self, inner, sizes: list) -> None:
        self.inner, self.sizes = inner, sizes

    def __call__(self, input_ids, **kw):
        out = self.inner(input_ids, **kw)
        self.sizes.append(len(out))
        return out


class MlxrEngine:
    """MLXR with one model-free proposer (n-gram, or suffix trees: the request's own only, as
    the rounds repeat the same requests); "off" is the same engine's requests with speculative=False."""

    def __init__(self, args, method: str) -> None:
        from mlxr import LLM
        from mlxr.config import SuffixConfig

        self.name, self.device = f"mlxr-{args.mlxr}-{method}", args.mlxr
        # No prefix cache: every run prefills its prompt, as the llama.cpp runs do (e2e_tok_s).
        self.llm = LLM(args.gguf, device=args.mlxr, speculative_method=method, num_speculative_tokens=args.k,
                       enable_prefix_caching=False, suffix=SuffixConfig(cache_responses=0))
        self.config = {"device": device_name(args.mlxr), "method": method}

    def run(self, ids: list[int], max_tokens: int, spec: bool) -> dict:
        from mlxr import SamplingParams

        before = self.llm.engine.stats()
        t0 = time.perf_counter()
        out = self.llm.generate([ids], SamplingParams(max_tokens=max_tokens, temperature=0, speculative=spec))[0]
        t_end = time.perf_counter()
        after = self.llm.engine.stats()
        m = out.metrics
        # the engine's clock is time.monotonic: the first token's time, moved to this clock
        t_first = t_end - (m.finished_time - m.first_token_time) if m and m.first_token_time and m.finished_time else t0
        return run_record(out.outputs[0].token_ids, t0, t_first, t_end,
                          after.spec_num_draft_tokens - before.spec_num_draft_tokens,
                          after.spec_num_accepted_tokens - before.spec_num_accepted_tokens)

    def close(self) -> None:
        self.llm.shutdown()


def warm(engines, prompts: list[list[int]]) -> None:
    for e in engines:
        for spec in (False, True):
            e.run(prompts[0], 16, spec)


def wait_for_quiet(max_load: float | None, max_wait: float = 180.0) -> None:
    """On a shared CPU: wait (up to max_wait s) until the 1-minute load average is below max_load."""
    deadline = time.monotonic() + max_wait
    while max_load is not None and os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)


def measure(engines, prompts: list[list[int]], max_tokens: int, rounds: int,
            max_load: float | None = None) -> dict[str, dict[tuple, list]]:
    """runs[engine][(task, spec)]: one record a round, the engines and modes interleaved."""
    runs = {e.name: {} for e in engines}
    for r in range(rounds):
        for task, ids in enumerate(prompts):
            wait_for_quiet(max_load)
            for e in engines:
                for spec in (False, True):
                    rec = e.run(ids, max_tokens, spec)
                    rec["load1"] = os.getloadavg()[0]  # the shared machine's load while it ran
                    runs[e.name].setdefault((task, spec), []).append(rec)
                    print(f"round {r} task {task} {e.name:16s} spec={'on ' if spec else 'off'} "
                          f"n={rec['n']:4d} gen {rec['gen_tok_s']:7.1f} tok/s  e2e {rec['e2e_tok_s']:7.1f}", flush=True)
    return runs


def summarize(name: str, runs: dict[tuple, list], num_tasks: int) -> dict:
    """Per task: medians over rounds; the engine's row: means over tasks (as spec_decode.py)."""
    med = lambda recs, key: statistics.median(r[key] for r in recs)  # noqa: E731
    per_task = []
    for task in range(num_tasks):
        off, on = runs[(task, False)], runs[(task, True)]
        drafted, accepted = sum(r["drafted"] for r in on), sum(r["accepted"] for r in on)
        per_task.append({"task": task, "off_gen_tok_s": med(off, "gen_tok_s"), "on_gen_tok_s": med(on, "gen_tok_s"),
                         "off_e2e_tok_s": med(off, "e2e_tok_s"), "on_e2e_tok_s": med(on, "e2e_tok_s"),
                         "tokens": on[0]["n"], "acceptance": accepted / drafted if drafted else 0.0,
                         "drafted": drafted, "identical": all(r["tokens"] == off[0]["tokens"] for r in off + on),
                         # each round's on/off pair ran back to back: their ratio sees the same load
                         "paired_gen_speedup": statistics.median(b["gen_tok_s"] / a["gen_tok_s"] for a, b in zip(off, on)),
                         "best_off_gen_tok_s": max(r["gen_tok_s"] for r in off),
                         "best_on_gen_tok_s": max(r["gen_tok_s"] for r in on),
                         "off_gen_all": [r["gen_tok_s"] for r in off], "on_gen_all": [r["gen_tok_s"] for r in on],
                         "load1": [r["load1"] for r in off + on]})
    mean = lambda key: statistics.fmean(t[key] for t in per_task)  # noqa: E731
    row = {"engine": name, "off_gen_tok_s": mean("off_gen_tok_s"), "on_gen_tok_s": mean("on_gen_tok_s"),
           "off_e2e_tok_s": mean("off_e2e_tok_s"), "on_e2e_tok_s": mean("on_e2e_tok_s"),
           "acceptance": mean("acceptance"), "identical": all(t["identical"] for t in per_task),
           "paired_gen_speedup": mean("paired_gen_speedup"), "best_off_gen_tok_s": mean("best_off_gen_tok_s"),
           "best_on_gen_tok_s": mean("best_on_gen_tok_s")}
    row["gen_speedup"] = row["on_gen_tok_s"] / row["off_gen_tok_s"]
    row["e2e_speedup"] = row["on_e2e_tok_s"] / row["off_e2e_tok_s"]
    for cls in TASK_CLASSES:  # each task class's mean paired speedup
        row[cls] = statistics.fmean(t["paired_gen_speedup"] for t, c in zip(per_task, TASK_CLASS) if c == cls)
    row["per_task"] = per_task
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server-bin", help="llama-server binary (its own speculation: ngram-simple)")
    ap.add_argument("--python", action="store_true", help="llama-cpp-python with LlamaPromptLookupDecoding")
    ap.add_argument("--mlxr", help="also MLXR's speculation on this device (cpu, cuda)")
    ap.add_argument("--mlxr-methods", nargs="+", default=["suffix", "ngram"], choices=["suffix", "ngram"],
                    help="MLXR's proposers, an engine each")
    ap.add_argument("--gpu", action="store_true", help="llama.cpp on the GPU (-ngl 99)")
    ap.add_argument("--gguf", default=str(smollm2_135m_path()))
    ap.add_argument("-k", type=int, default=4, help="draft tokens per step (bench/spec_decode.py's k)")
    ap.add_argument("--server-ngram", type=int, default=3, help="ngram-simple's lookup length (its size-n; <= k)")
    ap.add_argument("--python-ngram", type=int, default=4, help="LlamaPromptLookupDecoding's max_ngram_size")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's CPU threads (MLXR: torch's default)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--max-load", type=float, help="shared CPU: before each task's runs, wait (<= 3 min) until "
                    "the 1-minute load average is below this")
    args = ap.parse_args()
    with open_gguf(args.gguf) as f:
        tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
    prompts = [chat_ids(tokenizer, t) for t in TASKS]
    with contextlib.ExitStack() as stack:
        engines = []
        for method in args.mlxr_methods if args.mlxr else ():
            engines.append(MlxrEngine(args, method))
            stack.callback(engines[-1].close)
        if args.server_bin:
            engines.append(ServerEngine(args, stack))
        if args.python:
            engines.append(PythonEngine(args, tokenizer.stop_token_ids))
        if not engines:
            ap.error("name at least one engine: --server-bin, --python, --mlxr")
        warm(engines, prompts)
        runs = measure(engines, prompts, args.max_tokens, args.rounds, args.max_load)
        rows = [summarize(e.name, runs[e.name], len(prompts)) for e in engines]
        configs = {e.name: e.config for e in engines}
    print_table(rows, ["engine", "off_gen_tok_s", "on_gen_tok_s", "gen_speedup", "paired_gen_speedup", "off_e2e_tok_s",
                       "on_e2e_tok_s", "e2e_speedup", "acceptance", "identical", *TASK_CLASSES])
    for r in rows:
        print(f"{r['engine']}: speculation on/off {r['gen_speedup']:.2f}x decode (paired {r['paired_gen_speedup']:.2f}x), "
              f"{r['e2e_speedup']:.2f}x end to end, acceptance {r['acceptance']:.2f}")
    path = write_result("llama_spec", {
        "device": device_name(args.mlxr or ("cuda" if args.gpu else "cpu")), "cpu": cpu_model(),
        "llama_cpp_gpu": args.gpu, "threads": args.threads, "model": "smollm2:135m (Q4_1 GGUF)",
        "args": vars(args), "engines": configs, "rows": rows,
        "note": "batch 1, greedy, off/on interleaved per task and round; medians per task, means over tasks"})
    print(path)


if __name__ == "__main__":
    main()
