"""Triton paged attention (decode and prefill) against the torch reference.

Without CUDA the kernels run on the Triton CPU interpreter with tiny shapes; with CUDA the
`gpu` tests run a larger grid. Outputs start NaN-filled, so an unwritten element fails."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first import of a kernel module: @triton.jit reads it then.
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from mlxr.ops.attention.paged_attention import paged_attention, paged_attention_reference  # noqa: E402
from mlxr.ops.attention.paged_decode_triton import paged_decode_triton, plan_partitions  # noqa: E402
from mlxr.ops.attention.paged_prefill_triton import paged_prefill_triton  # noqa: E402
from test_paged_attention import build  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="CPU interpreter grid (CUDA runs the gpu grid)")
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
GQA = [(4, 4), (8, 2), (8, 1)]  # group sizes 1, 4, 8


def make(q_lens, seq_lens, heads, dim, block_size, dtype, device, seed=0):
    q, kc, vc, meta, _, _ = build(q_lens, seq_lens, heads[0], heads[1], dim, block_size, seed)
    for name in ("slot_mapping", "block_tables", "query_start_loc", "seq_lens"):
        setattr(meta, name, getattr(meta, name).to(device))
    return q.to(device, dtype), kc.to(device, dtype), vc.to(device, dtype), meta


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "unwritten (NaN) output"
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def check_decode(seq_lens, heads, dim, bs, window, dtype, device, softcap=None, **blocks):
    q, kc, vc, meta = make([1] * len(seq_lens), seq_lens, heads, dim, bs, dtype, device)
    out = torch.full_like(q, float("nan"))
    paged_decode_triton(q, kc, vc, meta.block_tables, meta.seq_lens, 0.3, window, softcap, out=out, **blocks)
    ref = paged_attention_reference(q, kc, vc, meta, 0.3, window, softcap)
    assert rel_err(out, ref) < TOL[dtype]


def check_prefill(q_lens, seq_lens, heads, dim, bs, window, dtype, device, softcap=None, **blocks):
    q, kc, vc, meta = make(q_lens, seq_lens, heads, dim, bs, dtype, device)
    out = torch.full_like(q, float("nan"))
    paged_prefill_triton(
        q, kc, vc, meta.block_tables, meta.seq_lens, meta.query_start_loc, max(q_lens),
        0.3, window, softcap, out=out, **blocks,
    )
    ref = paged_attention_reference(q, kc, vc, meta, 0.3, window, softcap)
    assert rel_err(out, ref) < TOL[dtype]


# One dim and dtype per case, cycled, so the CPU grid stays small but covers each value.
DIMS, DTYPES = [64, 128, 256], [torch.float32, torch.float16, torch.bfloat16]


@cpu_only
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
@pytest.mark.parametrize("window", [None, 24])
def test_decode_interpreted(heads, block_size, window):
    i = GQA.index(heads) + block_size
    # part_tokens=32 splits the 70-token context into 3 partitions; 1 and 9 fit in one.
    check_decode([1, 9, 70], heads, DIMS[i % 3], block_size, window, DTYPES[i % 3], "cpu",
                 part_tokens=32, block_n=16)


@cpu_only
@pytest.mark.parametrize("softcap,window", [(None, None), (5.0, 7)])
def test_decode_unsplit_and_softcap_interpreted(softcap, window):
    check_decode([1, 3, 40], (8, 2), 64, 4, window, torch.float32, "cpu", softcap, block_n=16)


@cpu_only
def test_decode_many_partitions_interpreted():
    # 19 partitions for the long sequence (merged by the second kernel), one for the short.
    check_decode([300, 2], (4, 1), 64, 16, None, torch.float32, "cpu", part_tokens=16, block_n=16)


@cpu_only
@pytest.mark.parametrize("part_tokens", [16, 64])  # 19 partitions, 5
def test_decode_row_with_no_context_is_written_as_zeros(part_tokens):
    """A zero-length row (no caller sends one today) gets zeros, not the buffer's garbage."""
    q, kc, vc, meta = make([1, 1], [300, 300], (8, 2), 64, 16, torch.float32, "cpu")
    ref = paged_attention_reference(q, kc, vc, meta, 0.3)
    out = torch.full_like(q, float("nan"))
    lens = meta.seq_lens.clone()
    lens[0] = 0
    paged_decode_triton(q, kc, vc, meta.block_tables, lens, 0.3, part_tokens=part_tokens, block_n=16, out=out)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert rel_err(out[1:], ref[1:]) < TOL[torch.float32]


def _decode_rows(q, kc, vc, meta, rows=slice(None), **knobs):
    return paged_decode_triton(q[rows], kc, vc, meta.block_tables[rows], meta.seq_lens[rows], 0.3, block_n=16, **knobs)


@cpu_only
def test_decode_row_is_the_same_alone_or_in_any_batch():
    """A row's output does not depend on the rows beside it (speculative rows must decode
    exactly as the plain row would): bit-identical."""
    lens = [300, 70, 5, 129, 257]
    q, kc, vc, meta = make([1] * len(lens), lens, (4, 2), 64, 16, torch.float32, "cpu")
    for part_tokens in (32, 16):  # 10 partitions merged inline, 19 by the reduce kernel
        together = _decode_rows(q, kc, vc, meta, part_tokens=part_tokens)
        for r in range(len(lens)):
            alone = _decode_rows(q, kc, vc, meta, slice(r, r + 1), part_tokens=part_tokens)
            assert torch.equal(together[r:r + 1], alone), (r, lens[r], part_tokens)


def test_partitions_do_not_follow_the_batch():
    """plan_partitions cuts rows the same way (min_part, max_parts) in any batch of up to 16
    rows, whatever the KV heads."""
    for span in (128, 300, 8192, 16384, 131072):
        for n_kv in (1, 3, 32):
            plans = {plan_partitions(span, n_seqs, n_kv, 132, 128)[:2] for n_seqs in (1, 5, 9, 16)}
            assert plans == {(128, 64)}, (span, n_kv, plans)
    assert plan_partitions(8192, 1, 3, 132, 128) == (128, 64, 64)
    assert plan_partitions(8192, 16, 3, 132, 128) == (128, 64, 64)
    # Past 16 rows whose KV heads fill the device: one partition a sequence, nothing to merge.
    assert plan_partitions(8192, 64, 3, 132, 128) == (8192, 1, 1)
    assert plan_partitions(8192, 40, 3, 132, 128)[:2] == (128, 64)


@cpu_only
def test_decode_row_is_the_same_whatever_the_table_width(monkeypatch):
    """A row's partitions and its merge (inline up to 16 partitions, else the second kernel)
    follow from its own length: a wider block table (an eager step beside a longer row, or a
    graph's max_model_len width) changes no bit."""
    from mlxr.ops.attention import paged_decode_triton as decode

    monkeypatch.setattr(decode, "PART_TOKENS", 16)  # 200 tokens: 13 partitions (inline), 300: 19
    lens = [200, 300]
    q, kc, vc, meta = make([1, 1], lens, (4, 2), 64, 16, torch.float32, "cpu")
    narrow = meta.block_tables
    wide = torch.zeros(2, 160, dtype=narrow.dtype)
    wide[:, : narrow.shape[1]] = narrow
    for r in range(2):
        rows = slice(r, r + 1)
        outs = [paged_decode_triton(q[rows], kc, vc, t[rows], meta.seq_lens[rows], 0.3, block_n=16)
                for t in (narrow, wide)]
        assert torch.equal(outs[0], outs[1]), lens[r]


@cpu_only
def test_decode_leaves_its_merge_tickets_at_zero_for_the_next_launch():
    """The last program of a (sequence, KV head) to finish merges and resets the group's
    counter: a second launch (a replayed graph) merges again, and the counters end at zero."""
    from mlxr.ops.backend import ticket_counters

    for _ in range(2):
        check_decode([70, 33, 5], (8, 2), 64, 16, None, torch.float32, "cpu", part_tokens=16, block_n=16)
    assert not ticket_counters(torch.device("cpu"), 6).any()


@cpu_only
@pytest.mark.parametrize("heads", GQA + [(6, 2)])
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
@pytest.mark.parametrize("window", [None, 6])
def test_prefill_interpreted(heads, block_size, window):
    i = heads[0] // heads[1] + block_size
    # A fresh prompt, a decode row, and a chunk on top of a cached prefix.
    check_prefill([9, 1, 20], [9, 13, 50], heads, DIMS[i % 3], block_size, window, DTYPES[i % 3],
                  "cpu", softcap=3.0 if window else None, block_m=16 if heads[0] == heads[1] else 32,
                  block_n=16)


def test_partition_plan_covers_the_span():
    for span in (1, 63, 64, 1000, 32768):
        for n_seqs in (1, 8, 1024):
            min_part, max_parts, n = plan_partitions(span, n_seqs, 2, 132, 64)
            part = max(min_part, -(-span // max_parts))  # the longest row's partitions
            assert min_part % 64 == 0 and n * part >= span and 1 <= n <= 64


def test_cpu_dispatch_is_the_reference():
    q, kc, vc, meta = make([3, 1], [8, 5], (8, 2), 16, 4, torch.float32, "cpu")
    ref = paged_attention_reference(q, kc, vc, meta, 0.3)
    assert torch.equal(paged_attention(q, kc, vc, meta, 0.3), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", GQA)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
@pytest.mark.parametrize("window", [None, 200])
def test_decode_gpu(heads, dim, block_size, window):
    dtype = DTYPES[(dim // 64 + block_size) % 3]
    lens = [1, 17, 300, 1500, 4100]
    check_decode(lens, heads, dim, block_size, window, dtype, "cuda")  # split-K (planned)
    # Up to 9 partitions (merged inline), and 33 (by the second kernel).
    for part_tokens in (512, 128):
        check_decode(lens, heads, dim, block_size, window, dtype, "cuda", part_tokens=part_tokens)
    # Unsplit, soft-capped; block_n = block_size takes the one-block-per-tile path.
    blocks = {"block_n": block_size} if block_size >= 16 else {}
    check_decode(lens, heads, dim, block_size, window, dtype, "cuda", 30.0, part_tokens=8192, **blocks)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [9, 16, 40])
def test_decode_row_is_the_same_alone_or_in_a_batch_gpu(batch):
    """With the planned partitions (the engine's path), a row decoded among `batch` rows (up to
    the count whose KV heads fill the device: 40 x 3 < 132) is bit-identical to the row
    decoded alone: speculative verify rows against plain decode."""
    from mlxr.ops.backend import sm_count

    if batch * 3 >= sm_count(torch.device("cuda")):
        pytest.skip("this GPU is filled by fewer rows")
    lens = [(37 * i + 300) % 1500 + 1 for i in range(batch)]
    q, kc, vc, meta = make([1] * batch, lens, (9, 3), 64, 16, torch.bfloat16, "cuda")
    together = paged_decode_triton(q, kc, vc, meta.block_tables, meta.seq_lens, 0.3)
    wide = torch.zeros(batch, 8192 // 16, dtype=meta.block_tables.dtype, device="cuda")  # a graph's width
    wide[:, : meta.block_tables.shape[1]] = meta.block_tables
    for r in range(batch):
        for tables in (meta.block_tables, wide):
            alone = paged_decode_triton(q[r:r + 1], kc, vc, tables[r:r + 1], meta.seq_lens[r:r + 1], 0.3)
            assert torch.equal(together[r:r + 1], alone), (r, lens[r], tables.shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", GQA + [(14, 2)])
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("window", [None, 100])
def test_prefill_gpu(heads, dim, block_size, window):
    dtype = DTYPES[(dim // 64 + block_size) % 3]
    check_prefill([300, 1, 77, 513], [300, 900, 1200, 513], heads, dim, block_size, window, dtype, "cuda")
    if block_size >= 16:  # one cache block per key tile
        check_prefill([300, 5], [300, 900], heads, dim, block_size, window, dtype, "cuda", block_n=block_size)


@pytest.mark.gpu
def test_gpu_dispatch_and_reference_switch(monkeypatch):
    q, kc, vc, meta = make([1] * 3, [5, 40, 300], (8, 2), 64, 16, torch.bfloat16, "cuda")
    fast = paged_attention(q, kc.nan_to_num(), vc.nan_to_num(), meta, 0.3)
    monkeypatch.setenv("MLXR_KERNELS", "reference")
    slow = paged_attention(q, kc.nan_to_num(), vc.nan_to_num(), meta, 0.3)
    assert not torch.equal(fast, slow) and rel_err(fast, slow) < TOL[torch.bfloat16]


def _compiled_variants(kernel) -> int:
    caches = getattr(kernel, "device_caches", None)
    if not caches:
        pytest.skip("this Triton keeps its compiled kernels elsewhere")
    return sum(len(cache[0]) for cache in caches.values())


@pytest.mark.gpu
def test_batch_shapes_reuse_one_compiled_kernel():
    """Block-table widths of 19 and 32 and partition counts of 5 to 16 (what changes from batch
    to batch while serving) run on one compiled kernel each, the merge too: no mid-serving
    compile."""
    from mlxr.ops.attention import paged_decode_triton as decode, paged_prefill_triton as prefill

    heads, dim, bs, dtype = (8, 2), 64, 16, torch.bfloat16
    check_prefill([5], [5], heads, dim, bs, None, dtype, "cuda")
    check_decode([300], heads, dim, bs, None, dtype, "cuda", part_tokens=64, block_n=32)  # inline merge
    check_decode([600], heads, dim, bs, None, dtype, "cuda", part_tokens=32, block_n=32)  # 19: merge kernel
    kernels = (prefill._prefill_kernel, decode._decode_partition_kernel, decode._decode_reduce_kernel)
    before = [_compiled_variants(k) for k in kernels]
    assert min(before) > 0
    for q_lens, seq_lens in (([5, 5], [70, 300]), ([3], [512])):
        check_prefill(q_lens, seq_lens, heads, dim, bs, None, dtype, "cuda")
        check_decode(seq_lens, heads, dim, bs, None, dtype, "cuda", part_tokens=64, block_n=32)  # 5, 8 parts
        check_decode(seq_lens * 4, heads, dim, bs, None, dtype, "cuda", part_tokens=32, block_n=32)  # 10, 16
        check_decode([2 * n for n in seq_lens], heads, dim, bs, None, dtype, "cuda", part_tokens=32,
                     block_n=32)  # 5 and 19, 32: the merge kernel
    after = [_compiled_variants(k) for k in kernels]
    assert after == before
