"""Inputs of one call -> padded batches: longest first, so each batch pads little, and each
batch's rows x its longest input stays within the token bound (an input alone may fill it)."""
from __future__ import annotations


def plan_batches(lengths: list[int], max_batch_tokens: int, max_rows: int) -> list[list[int]]:
    """Indices into `lengths`, one list per batch."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        batch = batches[-1] if batches else None
        # sorted longest first: the batch's first row is its widest
        if batch is not None and len(batch) < max_rows and (len(batch) + 1) * lengths[batch[0]] <= max_batch_tokens:
            batch.append(i)
        else:
            batches.append([i])
    return batches
