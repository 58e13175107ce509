"""The host tier's copies alone: what restoring a prefix costs the step loop.

A KV cache of a real model's shape (no weights), a prefix of --blocks blocks evicted to the host
pool in the order the block manager evicts them (last block first), then restored two ways:
"restore" (the blocks come back into free blocks) and "evict+restore" (each block taken for the
restore held another cached prefix, saved first: what the first hit after churn queues). Per
pattern: torch operator calls and copy calls per restore (a dispatch mode counts them), the host
time of flush() and the time until the copies are done, per block. Then "disk": the prefix
written to a disk tier in a temporary directory (the files in the page cache, as after a
restart on the same machine) and restored by a new store, its files read one by one while
looked up ("disk serial") or read ahead in parallel first ("disk read-ahead"), rounds
interleaved: lookups and copies, per block. Run it with the repository on PYTHONPATH to measure
this tree, or an older tree's to compare (the disk rows need this tree).

  python bench/kernels/kv_tier_copies.py --device cpu --shape smollm2
  python bench/kernels/kv_tier_copies.py --device cuda --shape smollm2 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, ...)
from common import device_name, median, print_table, sync, write_result
from mlxr.engine.kv.cache import KVCache
from mlxr.engine.kv.tiers import KVTiers
from mlxr.model_config import ModelArgs

SHAPES = {  # layers, kv heads, head dim (the models' config.json)
    "smollm2": (30, 3, 64),  # SmolLM2-135M
    "tinyllama": (22, 4, 64),  # TinyLlama-1.1B
    "gemma3": (18, 1, 256),  # gemma-3-270m
}


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def prefix_in_host(tiers: KVTiers, n: int) -> None:
    for b in reversed(range(n)):  # freed tail first, so evicted tail first
        tiers.evicted(b"prefix%d" % b, b)
    tiers.flush()


def queue_restore(tiers: KVTiers, n: int, with_evictions: bool, round_: int) -> None:
    for b in range(n):
        if with_evictions:
            tiers.evicted(b"other%d-%d" % (round_, b), n + b)
        tiers.load(tiers.lookup(b"prefix%d" % b), n + b)


def measure(tiers: KVTiers, n: int, with_evictions: bool, rounds: int, device: str) -> dict:
    host_s, done_s = [], []
    for r in range(rounds + 1):
        queue_restore(tiers, n, with_evictions, r)
        sync(device)
        if r == 0:  # the first round counts the calls (and warms up)
            counter = CountOps()
            with counter:
                tiers.flush()
            continue
        t0 = time.perf_counter()
        tiers.flush()
        host_s.append(time.perf_counter() - t0)
        sync(device)
        done_s.append(time.perf_counter() - t0)
    ops = counter.ops
    return {"blocks": n, "torch_calls": sum(ops.values()), "copy_calls": ops["copy_"] + ops["_to_copy"],
            "calls_by_op": dict(ops), "host_ms_per_block": 1e3 * median(host_s) / n,
            "done_ms_per_block": 1e3 * median(done_s) / n, "done_ms": 1e3 * median(done_s)}


def block_chain(n: int, block_size: int = 16) -> list:
    """n chained blocks (hash, parent, tokens) as the block manager hashes them: the disk tier
    writes and reads back only blocks whose tokens hash to their names."""
    from mlxr.engine.sched.block_manager import block_hash
    from mlxr.engine.kv.block_file import BlockIdentity

    blocks, parent = [], None
    for b in range(n):
        tokens = tuple(range(b * block_size, (b + 1) * block_size))
        blocks.append(BlockIdentity(block_hash(parent, tokens), parent, tokens))
        parent = blocks[-1].hash
    return blocks


def disk_rounds(kv: KVCache, n: int, rounds: int, device: str) -> dict[str, dict]:
    from pathlib import Path

    from mlxr.engine.kv.disk import READ_THREADS, DiskStore, Layout

    tiers_args = (kv, 0)
    layout = Layout("bench", str(kv.layers[0][0].dtype), 16, len(kv.layers), *kv.layers[0][0].shape[2:], device)
    blocks = block_chain(n)
    hashes = [block.hash for block in blocks]
    times: dict[str, list[float]] = {"disk serial": [], "disk read-ahead": []}
    with tempfile.TemporaryDirectory(prefix="kv-tier-copies-") as root:
        def store() -> DiskStore:  # the read-ahead row reads with READ_THREADS, whatever the cores
            return DiskStore(Path(root), layout, KVTiers(*tiers_args, None).block_bytes, 1 << 40, READ_THREADS)

        writer = KVTiers(*tiers_args, store())
        for b, block in enumerate(blocks):
            writer.committed(block.hash, b, block.parent, block.tokens)
        writer.close()
        for _ in range(rounds):
            for pattern in times:
                tiers = KVTiers(*tiers_args, store())
                sync(device)
                t0 = time.perf_counter()
                if pattern == "disk read-ahead":
                    tiers.prefetch(hashes)
                for b, h in enumerate(hashes):
                    tiers.load(tiers.lookup(h), n + b)
                tiers.flush()
                sync(device)
                times[pattern].append(time.perf_counter() - t0)
                assert tiers.disk.counters.hits == n
                tiers.close()
    return {p: {"blocks": n, "done_ms_per_block": 1e3 * median(t) / n, "done_ms": 1e3 * median(t)}
            for p, t in times.items()}


def layout_args(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The arguments every KV-tier copy bench takes: device, cache layout, prefix, rounds."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--blocks", type=int, default=253, help="the prefix in blocks of 16 (253: 4,048 tokens)")
    ap.add_argument("--rounds", type=int, default=rounds)
    return ap


def main() -> None:
    ap = layout_args(__doc__, rounds=5)
    ap.add_argument("--skip-disk", action="store_true", help="the host tier's rows only (an older tree)")
    ap.add_argument("--label", default="", help="names the tree measured (e.g. before / after)")
    args = ap.parse_args()
    layers, heads, dim = SHAPES[args.shape]
    model = ModelArgs("llama", 256, 64, 64, layers, num_attention_heads=heads, num_key_value_heads=heads, head_dim=dim)
    dtype, n = getattr(torch, args.dtype), args.blocks
    kv = KVCache(model, 3 * n, 16, dtype, torch.device(args.device))
    result = {"device": device_name(args.device), "shape": args.shape, "dtype": args.dtype, "label": args.label,
              "block_bytes": 2 * layers * 16 * heads * dim * kv.layers[0][0].element_size()}
    rows = []
    for pattern, evictions in (("restore", False), ("evict+restore", True)):
        # Room for the prefix and one round's evictions: each round's recycle the last round's
        # slots (least recently used), never the prefix's (each restore touches them).
        tiers = KVTiers(kv, host_blocks=2 * n + 8, disk=None)
        prefix_in_host(tiers, n)
        result[pattern] = measure(tiers, n, evictions, args.rounds, args.device)
        rows.append({"pattern": pattern, **{k: v for k, v in result[pattern].items() if k != "calls_by_op"}})
        del tiers
    if not args.skip_disk:
        for pattern, figures in disk_rounds(kv, n, args.rounds, args.device).items():
            result[pattern] = figures
            rows.append({"pattern": pattern, **figures})
    print_table(rows, ["pattern", "blocks", "torch_calls", "copy_calls", "host_ms_per_block", "done_ms_per_block",
                       "done_ms"])
    print(write_result("kv_tier_copies", result))


if __name__ == "__main__":
    main()
