"""Perplexity of a text, computed as llama.cpp's `llama-perplexity` does, so figures compare:
the tokens are cut into chunks of n_ctx, each chunk starts with BOS where the model wants one,
and only the second half of each chunk is scored (every scored token then has at least n_ctx/2
tokens of context). PPL = exp(mean negative log-likelihood over the scored tokens)."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mlxr.errors import InvalidParameterError

MIN_CTX = 16


@dataclass(frozen=True)
class ChunkScore:
    index: int  # 1-based, as llama.cpp prints its running estimate
    count: int  # how many tokens this chunk scored
    ppl: float  # the running estimate over every chunk so far
    stderr: float  # of that estimate (llama.cpp's "+/-")


def chunks_of(token_ids: list[int], n_ctx: int, bos: int | None) -> list[list[int]]:
    """Whole chunks of n_ctx tokens (a shorter tail is dropped, as llama.cpp does), each with
    its first token replaced by BOS where the model starts sequences with one."""
    if n_ctx < MIN_CTX:
        raise InvalidParameterError("ctx", f"must be at least {MIN_CTX}")
    chunks = [token_ids[i: i + n_ctx] for i in range(0, len(token_ids) - n_ctx + 1, n_ctx)]
    if not chunks:
        raise InvalidParameterError("text", f"{len(token_ids)} tokens: fewer than one chunk of {n_ctx}")
    return [[bos] + c[1:] if bos is not None else c for c in chunks]


def perplexity(chunks: list[list[int]], score: Callable[[list[int], int], list[float]]) -> Iterator[ChunkScore]:
    """The running estimate after each chunk. score(ids, first) gives the logprob of ids[i + 1]
    given ids[: i + 1] for i from first on (a chunk's prompt logprobs from there)."""
    total = total_sq = 0.0
    count = 0
    for index, ids in enumerate(chunks, start=1):
        nll = [-lp for lp in score(ids, len(ids) // 2)]
        total += sum(nll)
        total_sq += sum(x * x for x in nll)
        count += len(nll)
        mean = total / count
        var = max(total_sq / count - mean * mean, 0.0)
        ppl = math.exp(mean)
        yield ChunkScore(index, len(nll), ppl, ppl * math.sqrt(var / max(count - 1, 1)))
