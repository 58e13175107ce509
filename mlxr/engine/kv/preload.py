"""A restart's warm start of the KV cache: the disk tier's most recently used blocks are read,
verified and copied into free device blocks while the engine starts, as cached prefixes that no
request references, so the first requests after a restart find their prefixes on the device."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from mlxr.engine.kv.tiers import KVTiers, RestoreTimes

log = logging.getLogger(__name__)

PRELOAD_BUDGET_S = 20.0  # a start's preload stops here (a slow or network disk), whatever is left


def preload(tiers: KVTiers, adopt: Callable[[bytes], int | None], max_blocks: int) -> int:
    """Up to max_blocks of the disk's blocks into the device blocks adopt(hash) gives
    (BlockManager.adopt: cached, unreferenced; None when no empty block is left). Files that
    fail their checks are skipped (the disk store logs them). Returns the count."""
    if tiers.disk is None or max_blocks <= 0:
        return 0
    t0, count, before = time.perf_counter(), 0, vars(tiers.times).copy()
    for h in tiers.disk.most_recent(max_blocks):
        if time.perf_counter() - t0 > PRELOAD_BUDGET_S:
            log.warning("KV disk tier: preload stopped at its %.0f s budget", PRELOAD_BUDGET_S)
            break
        source = tiers.lookup(h)  # a staging row (the rows are flushed when they run out)
        if source is None:
            continue
        block = adopt(h)
        if block is None:
            break
        tiers.load(source, block)
        count += 1
    tiers.flush()
    if tiers.cuda:
        torch.cuda.current_stream(tiers.device).synchronize()  # the preload's time includes its copies
    took = time.perf_counter() - t0
    tiers.preloaded = count
    # Its reads and copies are the start's, not a request's restore: only preload_us counts them.
    tiers.times = RestoreTimes(**{**before, "preload_us": int(1e6 * took)})
    log.info("KV disk tier: %d blocks preloaded into the device cache in %.0f ms", count, 1e3 * took)
    return count
