"""Perplexity of one text on the same GGUF file: MLXR (`mlxr.perplexity`, what `mlxr perplexity`
runs), llama.cpp through llama-cpp-python (the chunks and scored positions of its
llama-perplexity: n_ctx tokens a chunk, BOS first, the second half scored), and HF transformers
on the file dequantized to fp32 (the reference both approximate). Also each engine's scoring
rate (tokens through the model a second, 2 threads).

  python bench/peers/perplexity_vs_llama_cpp.py --site /tmp/lcpp/lib/python3.11/site-packages
      [--models gemma3-270m smollm2:135m] [--text /usr/share/common-licenses/GPL-3] [--ctx 512]
      [--chunks 8]

JSON to bench/results/<day>/perplexity_vs_llama_cpp-*.json; a table last.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import print_table, write_result
from quant_cpu import model_file

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"  # on every Debian system


def mlxr_scores(llm, chunks: list[list[int]]) -> tuple[list[list[float]], float]:
    """Each chunk's prompt logprobs (token i + 1 given the ones before) and the seconds taken."""
    llm.engine.score_prompt(chunks[0][:32], 0)  # warm-up
    t0 = time.perf_counter()
    out = [[lp.logprob for lp in llm.engine.score_prompt(c, 0)[1]] for c in chunks]
    return out, time.perf_counter() - t0


def llama_scores(path: str, chunks: list[list[int]], threads: int) -> tuple[list[list[float]], float]:
    import numpy as np
    from llama_cpp import Llama

    n_ctx = len(chunks[0])
    llm = Llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads, n_threads_batch=threads,
                logits_all=True, verbose=False)
    out, elapsed = [], 0.0
    for c in chunks:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(c)
        elapsed += time.perf_counter() - t0
        logits = np.asarray(llm.scores[: len(c)], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
        out.append([float(logp[j, c[j + 1]]) for j in range(len(c) - 1)])
    return out, elapsed


def hf_scores(path: str, chunks: list[list[int]]) -> list[list[float]] | None:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name,
                                                     dtype=torch.float32).eval()
    except Exception as e:  # noqa: BLE001 - transformers does not read every GGUF type (Q4_1)
        print(f"HF transformers cannot load {path}: {e}", file=sys.stderr)
        return None
    out = []
    for c in chunks:
        with torch.inference_mode():
            logp = torch.log_softmax(model(torch.tensor([c])).logits[0].float(), dim=-1)
        out.append([logp[j, c[j + 1]].item() for j in range(len(c) - 1)])
    return out


def ppl(chunks: list[list[int]], scores: list[list[float]]) -> float:
    """llama-perplexity's figure (the second half of each chunk), as `mlxr perplexity` takes it."""
    from mlxr.perplexity import perplexity

    given = iter(scores)
    return list(perplexity(chunks, lambda _, first: next(given)[first:]))[-1].ppl


def one_model(name: str, text: str, ctx: int, max_chunks: int, threads: int) -> dict:
    import torch

    from mlxr import LLM
    from mlxr.loader.resolve import resolve_model
    from mlxr.perplexity import chunks_of

    path = str(resolve_model(model_file(name)).path)
    torch.set_num_threads(threads)
    llm = LLM(path, engine_process=False)
    tok = llm.tokenizer
    chunks = chunks_of(tok.encode(text), ctx, tok.bos_token_id if tok.add_bos_token else None)[:max_chunks]
    ours, ours_s = mlxr_scores(llm, chunks)
    llm.shutdown()
    peer, peer_s = llama_scores(path, chunks, threads)
    ref = hf_scores(path, chunks)
    tokens = sum(len(c) for c in chunks)
    row = {"model": name, "chunks": len(chunks), "ctx": ctx, "mlxr_ppl": ppl(chunks, ours),
           "llama_cpp_ppl": ppl(chunks, peer), "hf_fp32_ppl": ppl(chunks, ref) if ref else None,
           "mlxr_tok_s": tokens / ours_s, "llama_cpp_tok_s": tokens / peer_s}
    if ref:
        flat = lambda s: [x for c in s for x in c]  # noqa: E731
        row["mlxr_max_abs_vs_hf"] = max(abs(a - b) for a, b in zip(flat(ours), flat(ref)))
        row["llama_cpp_max_abs_vs_hf"] = max(abs(a - b) for a, b in zip(flat(peer), flat(ref)))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", required=True, help="site-packages holding llama_cpp (its own venv)")
    p.add_argument("--models", nargs="*", default=["gemma3-270m", "smollm2:135m"])
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    sys.path.append(a.site)  # after the project's own packages
    import llama_cpp

    text = Path(a.text).read_text()
    load_before = os.getloadavg()
    rows = [one_model(m, text, a.ctx, a.chunks, a.threads) for m in a.models]
    path = write_result("perplexity_vs_llama_cpp", {
        "text": a.text, "text_chars": len(text), "threads": a.threads, "llama_cpp_python": llama_cpp.__version__,
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "models": rows})
    print_table(rows, ["model", "chunks", "mlxr_ppl", "llama_cpp_ppl", "hf_fp32_ppl", "mlxr_max_abs_vs_hf",
                       "llama_cpp_max_abs_vs_hf", "mlxr_tok_s", "llama_cpp_tok_s"])
    print(path)


if __name__ == "__main__":
    main()
