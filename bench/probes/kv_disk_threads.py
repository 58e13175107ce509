"""How fast a prefix of KV block files is read back with N reader threads, and what limits it:
the disk tier's own read-ahead (DiskStore.prefetch + read) against the same files read with
os.pread alone, with and without the CRC-32. A tier of --blocks blocks of a real model's shape
is written to a temporary directory first (so the files are in the page cache, as after a
restart on one machine). Writes bench/results/kv_disk_threads-*.json.

  python bench/probes/kv_disk_threads.py --shape tinyllama --dtype bfloat16 --threads 1 4 8 16
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_path  # noqa: E402,F401,I001  (bench/ on sys.path: common, kv_tier_copies)
from common import cpu_model, median, print_table, write_result  # noqa: E402
from kv_tier_copies import SHAPES, block_chain  # noqa: E402

from mlxr.engine.kv.block_file import MAGIC, Layout, check_header, crc32, header_limit  # noqa: E402
from mlxr.engine.kv.disk import DiskStore  # noqa: E402


def read_raw(store: DiskStore, h: bytes, into: memoryview, crc: bool) -> None:
    fd = os.open(store._path(h), os.O_RDONLY)
    try:
        head = os.pread(fd, len(MAGIC) + 4 + header_limit(store.layout), 0)
        start, want = check_header(head, store.layout, h, len(into), store.key)
        got = os.preadv(fd, [into], start)
    finally:
        os.close(fd)
    assert got == len(into)
    if crc:
        assert crc32(into) == want


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tinyllama", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--blocks", type=int, default=258)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    layers, heads, dim = SHAPES[args.shape]
    item = 2 if args.dtype in ("bfloat16", "float16") else 4
    layout = Layout("probe", f"torch.{args.dtype}", 16, layers, heads, dim, "cuda")
    block_bytes = 16 * layers * 2 * heads * dim * item
    rows = []
    with tempfile.TemporaryDirectory(prefix="kv-disk-threads-") as root:
        writer = DiskStore(Path(root), layout, block_bytes, 1 << 40)
        blocks = block_chain(args.blocks)
        hashes = [block.hash for block in blocks]
        payload = [memoryview(os.urandom(block_bytes)) for _ in range(4)]
        writer.submit((blocks, lambda: [payload[i % 4] for i in range(len(hashes))], None))
        writer.drain()
        writer.close()
        buffers = [memoryview(bytearray(block_bytes)) for _ in hashes]
        for threads in args.threads:
            store = DiskStore(Path(root), layout, block_bytes, 1 << 40, read_threads=threads)
            pool = ThreadPoolExecutor(threads)

            def tier() -> None:
                store.prefetch(list(zip(hashes, buffers)))
                for h, b in zip(hashes, buffers):
                    assert store.read(h) is not None
                store.settle()

            def raw(crc: bool):
                return lambda: list(pool.map(lambda hb: read_raw(store, hb[0], hb[1], crc), zip(hashes, buffers)))

            cases = {"tier read-ahead": tier, "pread + crc": raw(True), "pread, no crc": raw(False)}
            ms = {name: [] for name in cases}
            for _ in range(args.rounds):
                for name, fn in cases.items():
                    ms[name].append(timed(fn))
            for name, runs in ms.items():
                m = median(runs)
                rows.append({"threads": threads, "case": name, "ms": round(m, 2),
                             "GB_s": round(args.blocks * block_bytes / m / 1e6, 2)})
            pool.shutdown()
            store.close()
    print_table(rows, ["threads", "case", "ms", "GB_s"])
    print(write_result("kv_disk_threads", {"cpu": cpu_model(), "cpus": os.cpu_count(), "shape": args.shape,
                                           "blocks": args.blocks, "block_bytes": block_bytes, 
                                           "rows": rows}))


if __name__ == "__main__":
    main()
