"""Prompt logprobs: each prompt token's logprob given the tokens before it (echo with logprobs,
vLLM's prompt_logprobs, lm-evaluation-harness's loglikelihood tasks), with its rank and the
top alternatives, under the raw logits as sampled tokens' logprobs are."""
from __future__ import annotations

from collections.abc import Iterable

import torch

from mlxr.engine.records import TokenLogprob
from mlxr.engine.worker.sampler import LOGPROB_FLOOR
from mlxr.ops.sampling import sampling as ops

# Positions whose logits exist at once: 256 x a 262k vocabulary is 268 MB of float32.
LOGIT_ROWS = 256


def logit_chunks(hidden: torch.Tensor, compute_logits, rows: int | None = None,
                 first: int = 0) -> Iterable[torch.Tensor]:
    """float32 logits of the positions from `first` to the one before the last (whose next
    token the prompt does not hold), `rows` (LOGIT_ROWS) positions at a time. Every rank of a
    tensor-parallel group runs the same chunks: the lm_head gathers across them."""
    rows = rows or LOGIT_ROWS
    for start in range(first, hidden.shape[0] - 1, rows):
        stop = min(start + rows, hidden.shape[0] - 1)
        yield compute_logits(hidden[start:stop]).float()


def score_rows(logits: torch.Tensor, next_ids: list[int], top: int) -> list[TokenLogprob]:
    """Each row's figures for the token that follows it in the prompt."""
    tokens = torch.tensor(next_ids, dtype=torch.long, device=logits.device)
    logprob, rank, lse = ops.raw_logprob_stats(logits, tokens)
    top = min(top, logits.shape[1])
    tops: list[list[tuple[int, float]]] = [[] for _ in next_ids]
    if top:
        values, ids = logits.topk(top, dim=-1)
        values = (values - lse.unsqueeze(-1)).nan_to_num(nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    return [TokenLogprob(t, _finite(lp), rk, tp)
            for t, lp, rk, tp in zip(next_ids, logprob.tolist(), rank.tolist(), tops)]


def _finite(lp: float) -> float:
    return LOGPROB_FLOOR if lp != lp or lp == float("-inf") else lp


def prompt_logprobs(chunks: Iterable[torch.Tensor], token_ids: list[int], top: int,
                    first: int = 0) -> list[TokenLogprob]:
    """Figures for token_ids[first + 1:], from the logit chunks of logit_chunks(first=first)."""
    out: list[TokenLogprob] = []
    for logits in chunks:
        start = first + len(out) + 1
        out += score_rows(logits, token_ids[start: start + logits.shape[0]], top)
    return out
