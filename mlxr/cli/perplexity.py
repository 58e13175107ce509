"""`mlxr perplexity FILE`: a model's perplexity on a text, chunk by chunk, as llama.cpp's
`llama-perplexity -f FILE -c CTX` computes it (to compare quantizations of one model)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mlxr.cli.options import add_model_options, model_path
from mlxr.config import KV_CACHE_DTYPES
from mlxr.errors import InvalidParameterError

MAX_TEXT_BYTES = 64 << 20  # wikitext-2's test split is 1.3 MB
DEFAULT_CTX = 512  # llama-perplexity's usual -c


def register(sub: argparse._SubParsersAction) -> dict:
    p = sub.add_parser("perplexity", help="perplexity of a text file (as llama.cpp's llama-perplexity)")
    add_model_options(p, positional=False)
    p.add_argument("file", help="a UTF-8 text file, or - for standard input")
    p.add_argument("--ctx", "-c", type=int, default=None,
                   help="tokens a chunk (default 512, or the model's context where shorter)")
    p.add_argument("--chunks", type=int, default=None, help="score at most this many chunks")
    p.add_argument("--json", action="store_true", help="one JSON object at the end instead of the running estimate")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=None,
                   help="how the KV cache stores K and V (as `mlxr serve --kv-cache-dtype`)")
    return {"perplexity": cmd_perplexity}


def read_text(name: str) -> str:
    raw = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1) if name == "-" else _read_file(Path(name))
    if len(raw) > MAX_TEXT_BYTES:
        raise InvalidParameterError("file", f"over {MAX_TEXT_BYTES >> 20} MB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidParameterError("file", f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def _read_file(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(MAX_TEXT_BYTES + 1)
    except OSError as e:
        raise InvalidParameterError("file", f"cannot read {path}: {e.strerror}") from None


def cmd_perplexity(ns: argparse.Namespace) -> int:
    from mlxr.cli.progress import load_llm
    from mlxr.perplexity import chunks_of, perplexity

    text = read_text(ns.file)
    llm = load_llm(model_path(ns.model), ns,
                   **({} if ns.kv_cache_dtype is None else {"kv_cache_dtype": ns.kv_cache_dtype}))
    context = llm.engine.max_model_len
    ctx = min(DEFAULT_CTX, context) if ns.ctx is None else ns.ctx
    if ctx > context:
        raise InvalidParameterError("ctx", f"{ctx} is over the model's context of {context}")
    tok = llm.tokenizer
    chunks = chunks_of(tok.encode(text), ctx, tok.bos_token_id if tok.add_bos_token else None)
    if ns.chunks is not None:
        chunks = chunks[: max(ns.chunks, 1)]
    score = lambda ids, first: [lp.logprob for lp in llm.engine.score_prompt(ids, 0, first)[1]]  # noqa: E731
    last, scored = None, 0
    for last in perplexity(chunks, score):
        scored += last.count
        if not ns.json:
            print(f"[{last.index}]{last.ppl:.4f},", end="", flush=True)
    if ns.json:
        print(json.dumps({"model": ns.model, "ctx": ctx, "chunks": last.index, "scored_tokens": scored,
                          "ppl": last.ppl, "stderr": last.stderr}))
    else:
        print(f"\nFinal estimate: PPL = {last.ppl:.4f} +/- {last.stderr:.5f}")
    return 0
