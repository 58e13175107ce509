"""Pure tensor math for sampling: logit processors, filters and the random draw.

Every function works on a float32 [R, V] tensor of logits (R rows, each with its own
parameters given as [R] tensors) and returns a new tensor unless its name ends in `_`.
Masked tokens are -inf. Nothing here knows about requests or generators.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from mlxr.ops.backend import use_triton

NEG_INF = float("-inf")


def sanitize(logits: torch.Tensor) -> torch.Tensor:
    """A float32 copy with NaN -> -inf and +inf -> the largest finite value."""
    big = torch.finfo(torch.float32).max
    if logits.dtype == torch.float32:  # the copy and the replacement in one pass
        return torch.nan_to_num(logits, nan=NEG_INF, posinf=big, neginf=NEG_INF)
    return torch.nan_to_num_(logits.to(torch.float32), nan=NEG_INF, posinf=big, neginf=NEG_INF)


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Ban (-inf) every token whose bit is clear in a packed int32 bitmask [R, W] (bit j of
    word i is token 32 * i + j, as llguidance and xgrammar pack them); tokens past 32 * W too."""
    rows, vocab = logits.shape
    if use_triton(logits, bitmask) and logits.dtype == torch.float32:
        from mlxr.ops.sampling.bitmask_triton import apply_token_bitmask_triton
        apply_token_bitmask_triton(logits, bitmask)
        return
    if bitmask.device.type == "cpu" and sys.byteorder == "little":
        # numpy unpacks the words' bytes, low bit first, in one pass (the shifts below take several)
        bits = np.unpackbits(bitmask.contiguous().numpy().view(np.uint8), axis=-1, bitorder="little")
        allowed = torch.from_numpy(bits.view(np.bool_))
    else:
        shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(rows, -1).bool()
    width = min(vocab, allowed.shape[1])
    logits[:, :width].masked_fill_(~allowed[:, :width], NEG_INF)
    logits[:, width:] = NEG_INF


def unique_pairs(
    rows: torch.Tensor, cols: torch.Tensor, vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct (row, col) pairs and how often each occurs."""
    keys, counts = torch.unique(rows * vocab + cols, return_counts=True)
    return keys // vocab, keys % vocab, counts


def set_values_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor
) -> None:
    logits.index_put_((rows, cols), values)


def add_values_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor
) -> None:
    """logits[rows, cols] += values, for (row, col) pairs that are distinct."""
    logits.index_put_((rows, cols), logits[rows, cols] + values)


def repetition_penalty_(
    logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, penalty: torch.Tensor
) -> None:
    """HF semantics: positive logits / p, others * p, once per seen (row, token).

    Pairs may repeat: all reads happen before the write, so repeats write equal values.
    """
    v = logits[rows, cols]
    p = penalty[rows]
    # A penalty below 1 can push a huge positive logit past float32's range.
    penalised = torch.where(v > 0, v / p, v * p).clamp_max_(torch.finfo(torch.float32).max)
    logits.index_put_((rows, cols), penalised)


def presence_frequency_(
    logits: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    counts: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> None:
    """OpenAI semantics on distinct (row, token) pairs seen `counts` times."""
    penalty = presence[rows] + frequency[rows] * counts.to(torch.float32)
    add_values_(logits, rows, cols, -penalty)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    # Shifting by the row max first keeps tiny temperatures from overflowing to inf.
    row_max = logits.amax(dim=-1, keepdim=True)
    return (logits - row_max).div_(temperature.unsqueeze(-1))


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor, k_max: int | None = None
) -> torch.Tensor:
    """Top-k (1 <= k <= V; V = off), then nucleus top-p on the renormalised rest.

    Nucleus keeps the fewest most-likely tokens whose mass reaches p, at least one.
    When every row has k < V only the top k_max are sorted, not the whole vocab.
    k_max (max of k) may be given by a caller that knows it, saving a wait for the device.
    """
    vocab = logits.shape[-1]
    k_max = int(k.max().item()) if k_max is None else k_max
    if k_max >= vocab and logits.device.type == "cpu":
        return _top_p_cpu(logits, top_p)
    if k_max < vocab:
        sorted_logits, order = logits.topk(k_max, dim=-1)
    else:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
    pos = torch.arange(sorted_logits.shape[-1], device=logits.device)
    sorted_logits = sorted_logits.masked_fill(pos >= k.unsqueeze(-1), NEG_INF)
    probs = sorted_logits.softmax(dim=-1)
    return _keep_nucleus(logits, sorted_logits, order, probs.cumsum(dim=-1) - probs, top_p)


def _keep_nucleus(logits: torch.Tensor, sorted_logits: torch.Tensor, order: torch.Tensor,
                  mass_before: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Logits shaped as `logits`: the sorted candidates (taken from positions `order`) within
    each row's nucleus, NEG_INF everywhere else."""
    pos = torch.arange(sorted_logits.shape[-1], device=logits.device)
    # The most likely token always survives (a top_p under float32's range arrives as 0, and
    # 0 >= 0 would drop it: every token gone, token 0 drawn); p == 1 is off (rounding could
    # otherwise push the tail's mass_before to 1.0 and drop it).
    drop = (mass_before >= top_p.unsqueeze(-1)) & (top_p < 1.0).unsqueeze(-1) & (pos > 0)
    return torch.full_like(logits, NEG_INF).scatter_(-1, order, sorted_logits.masked_fill(drop, NEG_INF))


NUCLEUS_FIRST = 64  # _top_p_cpu's first candidate count; each retry takes 8x as many


def _top_p_cpu(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus top-p alone, as apply_top_k_top_p keeps it, without sorting the vocabulary: the
    nucleus lies within the fewest top logits whose probability mass reaches every row's
    top_p, found by taking 64, 512, ... of them (a full sort of 49k logits a row cost a CPU
    ~7 ms a row). A check of the device's values each try: CPU tensors only."""
    vocab = logits.shape[-1]
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    n = min(NUCLEUS_FIRST, vocab)
    while True:
        top, order = logits.topk(n, dim=-1)
        probs = (top - lse).exp_()
        mass = probs.cumsum(dim=-1)
        # The last cumulative sum, as the masks below see it: past it every mass_before is larger.
        if n == vocab or bool((mass[:, -1] >= top_p).all()):
            break
        n = min(n * 8, vocab)
    return _keep_nucleus(logits, top, order, mass - probs, top_p)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens with prob < min_p * max_prob, compared in log space (no softmax)."""
    row_max = logits.amax(dim=-1, keepdim=True)
    floor = row_max + torch.log(min_p).unsqueeze(-1)
    return logits.masked_fill(logits < floor, NEG_INF)


def _search(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """First index with cdf > target, per row; never a zero-width (zero-weight) entry."""
    picked = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)
    # First index of the max = last entry with weight; guards target rounding up to the total.
    return torch.minimum(picked, cdf.argmax(dim=-1))


def inverse_cdf_sample(
    logits: torch.Tensor, uniform: torch.Tensor, block: int = 1024
) -> torch.Tensor:
    """One token per row from softmax(logits), given one U[0, 1) draw per row.

    One uniform per row (not V exponentials) because CPU RNG is serial and costs ~20 ns
    per number. Sums are float64 so 262k-token vocabularies stay unbiased; a two-level
    search (block sums, then one block) avoids a float64 scan over the whole vocab.
    """
    rows, vocab = logits.shape
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp_()
    if vocab % block:
        weights = torch.nn.functional.pad(weights, (0, block - vocab % block))
    blocks = weights.view(rows, -1, block)
    block_cdf = blocks.sum(dim=-1, dtype=torch.float64).cumsum_(dim=-1)
    target = uniform.to(torch.float64) * block_cdf[:, -1]
    b = _search(block_cdf, target)
    before = block_cdf.gather(-1, (b - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)
    before = torch.where(b > 0, before, torch.zeros_like(before))
    inner_cdf = blocks[torch.arange(rows, device=logits.device), b].to(torch.float64).cumsum_(-1)
    return b * block + _search(inner_cdf, (target - before).clamp_min(0.0))


def raw_logprob_stats(
    logits: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprob of each chosen token, its rank with 1 = best, the row logsumexp)."""
    lse = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, tokens.unsqueeze(-1))
    rank = (logits > chosen).sum(dim=-1, dtype=torch.int64) + 1
    return chosen.squeeze(-1) - lse, rank, lse
