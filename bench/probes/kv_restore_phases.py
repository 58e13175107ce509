"""Where restoring a prefix's KV blocks spends its time, phase by phase, on this machine.

A KV cache of a real model's shape (no weights), --blocks blocks written to a disk tier in a
temporary directory (so the files are in the page cache, as after a restart on one machine).
Then, rounds interleaved:
- "files, bytes+copy": each file read the way the tier read it before (a bytearray per file,
  header parsed, CRC-32, then a torch copy of the payload into a staging row), per phase;
- "files, into rows": each file read the way it reads now (header and size, the payload read
  straight into its staging row, CRC-32 over the row), per phase;
- "rows -> cache, per layer": the staged rows into the cache as before (one index_copy_ per
  layer's K and V, on torch's threads; on CUDA after one host-to-device copy);
- "rows -> cache, one call": as now (one index_copy_ into the one cache tensor; on CPU on the
  calling thread alone, kv/staging.py one_thread);
- "tiers serial" / "tiers read-ahead": a new store restores the prefix through KVTiers (lookups,
  then one flush), its host time per phase (KVTiers.times) and the time until the copies end;
- "host pool": the prefix restored from the host tier (flush host time, time until done).
--busy N keeps N cores busy with spinning processes of the probe's own for the whole run (what
other jobs do to a shared host). Writes bench/results/kv_restore_phases-*.json.

  python bench/probes/kv_restore_phases.py --device cpu --shape smollm2 [--busy 1]
  python bench/probes/kv_restore_phases.py --device cuda --shape tinyllama --dtype bfloat16
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

import bench_path  # noqa: E402,F401,I001  (bench/ on sys.path: common, kv_tier_copies)
from common import cpu_model, device_name, median, print_table, sync, write_result  # noqa: E402
from kv_tier_copies import SHAPES, block_chain, layout_args  # noqa: E402

from mlxr.engine.kv.block_file import MAGIC, Layout, check_header, crc32, header_limit  # noqa: E402
from mlxr.engine.kv.cache import KVCache  # noqa: E402
from mlxr.engine.kv.disk import READ_THREADS, DiskStore  # noqa: E402
from mlxr.engine.kv.staging import one_thread  # noqa: E402
from mlxr.engine.kv.tiers import KVTiers  # noqa: E402
from mlxr.model_config import ModelArgs  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self.t = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.ms[phase] = self.ms.get(phase, 0.0) + 1e3 * (now - self.t)
        self.t = now


def files_bytes_then_copy(store: DiskStore, hashes: list[bytes], rows: torch.Tensor) -> dict[str, float]:
    """The read path before: a fresh bytearray per file, then a torch copy into the row."""
    c = Clock()
    for i, h in enumerate(hashes):
        buf = bytearray(len(MAGIC) + 4 + header_limit(store.layout) + store.block_bytes + 1)
        c.lap("alloc")
        view, n = memoryview(buf), 0
        with open(store._path(h), "rb", buffering=0) as f:
            while n < len(buf) and (got := f.readinto(view[n:])):
                n += got
        c.lap("open+read")
        (size,) = struct.unpack_from("<I", view, len(MAGIC))
        header = json.loads(bytes(view[len(MAGIC) + 4 : len(MAGIC) + 4 + size]))
        payload = view[len(MAGIC) + 4 + size : n]
        c.lap("header")
        assert zlib.crc32(payload) == header["crc32"]
        c.lap("crc32")
        rows[i].copy_(torch.frombuffer(payload, dtype=rows.dtype).view(rows.shape[1:]))
        c.lap("torch copy")
    return c.ms


def files_into_rows(store: DiskStore, hashes: list[bytes], rows: torch.Tensor) -> dict[str, float]:
    """The read path now (DiskStore._read_into, phase by phase)."""
    flat = memoryview(rows.view(-1).view(torch.uint8).numpy())
    bb, c = store.block_bytes, Clock()
    for i, h in enumerate(hashes):
        into = flat[i * bb : (i + 1) * bb]
        with open(store._path(h), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            start, crc = check_header(f.read(len(MAGIC) + 4 + header_limit(store.layout)), store.layout, h, bb,
                                      store.key)
            assert size == start + bb
            c.lap("open+header")
            f.seek(start)
            assert f.readinto(into) == bb
        c.lap("read into row")
        assert crc32(into) == crc
        c.lap("crc32")
    return c.ms


def rows_to_cache(kv: KVCache, rows: torch.Tensor, first_block: int, device: str, per_layer: bool) -> dict:
    c = Clock()
    idx = torch.arange(first_block, first_block + rows.shape[0], device=kv.layers[0][0].device)
    staged = rows.to(idx.device, non_blocking=True) if device == "cuda" else rows
    if per_layer:
        for layer, (k, v) in enumerate(kv.layers):
            k.index_copy_(0, idx, staged[:, layer, 0])
            v.index_copy_(0, idx, staged[:, layer, 1])
    else:
        with one_thread() if device == "cpu" else contextlib.nullcontext():
            kv.blocks.index_copy_(2, idx, staged.permute(1, 2, 0, 3, 4, 5))
    sync(device)
    c.lap("index_copy" if device == "cpu" else "h2d+index_copy")
    return c.ms


def through_tiers(kv: KVCache, store: DiskStore, hashes: list[bytes], read_ahead: bool, device: str) -> dict:
    tiers = KVTiers(kv, 0, store)
    n = len(hashes)
    sync(device)
    t0 = time.perf_counter()
    if read_ahead:
        tiers.prefetch(hashes)
    for b, h in enumerate(hashes):
        tiers.load(tiers.lookup(h), n + b)
    tiers.flush()
    host = time.perf_counter() - t0
    sync(device)
    done = time.perf_counter() - t0
    assert store.counters.hits == n
    out = {k.replace("_us", "_ms"): v / 1e3 for k, v in vars(tiers.times).items()}
    tiers.close()
    return {**out, "host_ms": 1e3 * host, "done_ms": 1e3 * done}


def host_pool(kv: KVCache, n: int, device: str) -> dict:
    tiers = KVTiers(kv, n, None)
    for b in reversed(range(n)):  # evicted tail first, as the block manager frees them
        tiers.evicted(b"prefix%d" % b, b)
    tiers.flush()
    sync(device)
    for b in range(n):
        tiers.load(tiers.lookup(b"prefix%d" % b), n + b)
    t0 = time.perf_counter()
    tiers.flush()
    host = time.perf_counter() - t0
    sync(device)
    return {"host_ms": 1e3 * host, "done_ms": 1e3 * (time.perf_counter() - t0)}


def main() -> None:
    ap = layout_args(__doc__, rounds=3)
    ap.add_argument("--busy", type=int, default=0, help="cores kept busy by spinning processes meanwhile")
    args = ap.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        run(args)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def run(args) -> None:
    layers, heads, dim = SHAPES[args.shape]
    model = ModelArgs("llama", 256, 64, 64, layers, num_attention_heads=heads, num_key_value_heads=heads, head_dim=dim)
    dtype, n, device = getattr(torch, args.dtype), args.blocks, args.device
    kv = KVCache(model, 3 * n, 16, dtype, torch.device(device))
    for k, v in kv.layers:
        k.normal_(), v.normal_()
    layout = Layout("probe", str(dtype), 16, layers, heads, dim, device)
    blocks = block_chain(n)
    hashes = [block.hash for block in blocks]
    rows = torch.empty((n, layers, 2, 16, heads, dim), dtype=dtype, pin_memory=device == "cuda")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="kv-restore-phases-") as root:
        def store(threads: int) -> DiskStore:
            return DiskStore(Path(root), layout, rows[0].numel() * rows.element_size(), 1 << 40, threads)

        writer = KVTiers(kv, 0, store(0))
        for b, block in enumerate(blocks):
            writer.committed(block.hash, b, block.parent, block.tokens)
        writer.close()
        probe = store(0)
        for _ in range(args.rounds):
            for name, fn in (("files, bytes+copy", lambda: files_bytes_then_copy(probe, hashes, rows)),
                             ("files, into rows", lambda: files_into_rows(probe, hashes, rows)),
                             ("rows -> cache, per layer", lambda: rows_to_cache(kv, rows, n, device, True)),
                             ("rows -> cache, one call", lambda: rows_to_cache(kv, rows, n, device, False)),
                             ("tiers serial", lambda: through_tiers(kv, store(0), hashes, False, device)),
                             ("tiers read-ahead", lambda: through_tiers(kv, store(READ_THREADS), hashes, True, device)),
                             ("host pool", lambda: host_pool(kv, n, device))):
                results.setdefault(name, []).append(fn())
        probe.close()
    table, summary = [], {}
    for name, runs_ in results.items():
        summary[name] = {k: median([r[k] for r in runs_]) for k in runs_[0]}
        table += [{"case": name, "phase": k, "ms": f"{v:.1f}"} for k, v in summary[name].items()]
    print_table(table, ["case", "phase", "ms"])
    result = {"device": device_name(device), "cpu": cpu_model(), "cpus": os.cpu_count(),
              "torch_threads": torch.get_num_threads(), "load_avg": os.getloadavg(), "busy_cores": args.busy,
              "shape": args.shape,
              "dtype": args.dtype, "blocks": n, "mb": n * rows[0].numel() * rows.element_size() / 1e6,
              "median_ms": summary, "rounds": results}
    print(write_result("kv_restore_phases", result))


if __name__ == "__main__":
    main()
