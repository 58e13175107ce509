"""Embedding throughput (sequences/s) on the CPU: MLXR's encoder engine beside llama.cpp's
llama-embedding on the same GGUF (a bge-small-shaped random BERT, 384 hidden x 12 layers,
written by transformers and converted by llama.cpp's convert_hf_to_gguf.py), run by run
interleaved, both on --threads threads. Each side's figure is its compute alone: MLXR's
embed_many call on token ids; llama-embedding's wall time less that of the same command on
one one-word prompt just before (its load and start-up; llama-embedding prints no timer of its
own), so neither counts its model load. JSON to bench/results/<day>/embeddings-*.json.

  .venv/bin/python bench/embeddings.py --llama-bin /work/lcpp/llama.cpp/build-cpu/bin
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from pathlib import Path

import torch

from common import cpu_model, median, print_table, write_result

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the quick brown fox jumps over the lazy dog paris is the capital and largest city of france "
         "berlin is the capital of germany foxes are small omnivorous mammals").split()


def texts(n: int, words: int) -> list[str]:
    """n distinct texts of `words` words each (rotations of one word list)."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(words)) for i in range(n)]


def mlxr_run(engine, ids: list[list[int]]) -> float:
    t0 = time.perf_counter()
    asyncio.run(engine.embed_many(ids))
    return time.perf_counter() - t0


def llama_wall(binary: Path, gguf: Path, prompts: list[str], threads: int, batch: int) -> float:
    cmd = [str(binary), "-m", str(gguf), "-p", "\n".join(prompts), "-t", str(threads), "-tb", str(threads),
           "-b", str(batch), "-ub", str(batch), "-c", str(batch), "--no-warmup", "--embd-output-format", "json"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    if res.returncode != 0 or '"embedding"' not in res.stdout:
        raise RuntimeError(f"llama-embedding failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return took


def llama_run(binary: Path, gguf: Path, prompts: list[str], threads: int, batch: int) -> float:
    """Seconds llama-embedding spends on the prompts beyond its start-up (a one-word run)."""
    start_up = llama_wall(binary, gguf, ["hello"], threads, batch)
    return max(llama_wall(binary, gguf, prompts, threads, batch) - start_up, 1e-6)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-bin", type=Path, default=Path("/work/lcpp/llama.cpp/build-cpu/bin"))
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--words", type=int, default=40, help="words per text (about 2.5 tokens each here)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-tokens", type=int, default=2048, help="both sides' batch bound (tokens)")
    a = p.parse_args()
    from mlxr.engine.encoder.encoder_engine import EncoderEngine
    from mlxr.loader.encoder_model import load_encoder
    from mlxr.testing.encoder_fixtures import encoder_gguf

    torch.set_num_threads(a.threads)
    gguf = encoder_gguf("bge-small-shape", ROOT / ".fixtures")
    loaded = load_encoder(str(gguf))
    engine = EncoderEngine(loaded.model, loaded.args, loaded.device, loaded.pooling, loaded.normalize, a.batch_tokens)
    prompts = texts(a.sequences, a.words)
    ids = [loaded.tokenizer.encode(t) for t in prompts]
    mlxr_run(engine, ids[:4])  # warm: first-call allocations
    ours, peer = [], []
    for _ in range(a.runs):  # interleaved: both see the same load on a shared host
        ours.append(a.sequences / mlxr_run(engine, ids))
        peer.append(a.sequences / llama_run(a.llama_bin / "llama-embedding", gguf, prompts, a.threads, a.batch_tokens))
    engine.shutdown()
    row = {"sequences": a.sequences, "tokens_per_seq": round(sum(map(len, ids)) / len(ids), 1),
           "mlxr_seq_s": round(median(ours), 1), "llama_cpp_seq_s": round(median(peer), 1),
           "ratio": round(median(ours) / median(peer), 2)}
    print_table([row], list(row))
    path = write_result("embeddings", {"cpu": cpu_model(), "threads": a.threads, "load_avg": os.getloadavg(),
                                       "host": "shared (other jobs running)", "model": "bge-small-shape random BERT, f32 GGUF",
                                       "runs": {"mlxr_seq_s": ours, "llama_cpp_seq_s": peer}, **row})
    print(path)


if __name__ == "__main__":
    main()
