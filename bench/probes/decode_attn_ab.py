"""The paged decode attention of this tree against another version of its file (another
commit's `mlxr/ops/attention/paged_decode_triton.py`, saved with `git show REV:PATH > FILE`), each
timed over 20 launches in one CUDA graph (gemv.graph_us) at SmolLM2's heads (9 query, 3 KV, d = 64) and a
512-block table (a graph's width at 8k context), for a few (rows, context) shapes; outputs
compared. Kernel time alone: an engine's tok/s at batch 64 also moves with where its requests stop
(see bench/results/2026-11-29/README.md, the ninth session). JSON to bench/results/decode_attn_ab-*.json.

  git show 53fa2a1:mlxr/ops/attention/paged_decode_triton.py > /tmp/old_decode.py
  python bench/probes/decode_attn_ab.py --old /tmp/old_decode.py
"""
from __future__ import annotations

import argparse
import importlib.util

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import device_name, write_result
from gemv import graph_us
from mlxr.ops.attention import paged_decode_triton as this_tree

SHAPES = ((1, 300), (1, 1000), (9, 300), (16, 400), (32, 400), (64, 400), (64, 2000), (128, 400))
HEADS, KV_HEADS, DIM, BLOCK, WIDTH = 9, 3, 64, 16, 512


def load_file(path: str):
    spec = importlib.util.spec_from_file_location("other_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case(modules: dict, rows: int, ctx: int, kc: torch.Tensor, vc: torch.Tensor) -> dict:
    n_blocks = kc.shape[0]
    q = torch.randn(rows, HEADS, DIM, dtype=kc.dtype, device="cuda")
    need = -(-ctx // BLOCK)
    tables = torch.zeros(rows, WIDTH, dtype=torch.long, device="cuda")
    for r in range(rows):  # each row its own scattered blocks
        tables[r, :need] = torch.randperm(n_blocks - 1, device="cuda")[:need]
    lens = torch.full((rows,), ctx, dtype=torch.long, device="cuda")
    row = {"rows": rows, "ctx": ctx}
    for rep in range(2):  # alternated, twice
        for name, module in modules.items():
            row[f"{name}_us_{rep}"] = graph_us([lambda: module.paged_decode_triton(q, kc, vc, tables, lens, 0.125)], 20)
    outs = [m.paged_decode_triton(q, kc, vc, tables, lens, 0.125).float() for m in modules.values()]
    row["max_abs_diff"] = (outs[0] - outs[1]).abs().max().item()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="another version of paged_decode_triton.py")
    a = p.parse_args()
    torch.manual_seed(0)
    kc = torch.randn(64 * 40 + 1, BLOCK, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    vc = torch.randn_like(kc)
    modules = {"tree": this_tree, "old": load_file(a.old)}
    rows = []
    for n, ctx in SHAPES:
        rows.append(case(modules, n, ctx, kc, vc))
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    print(write_result("decode_attn_ab", {"device": device_name("cuda"), "old": a.old, "rows": rows}))


if __name__ == "__main__":
    main()
