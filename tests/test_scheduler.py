"""Scheduler with a fake model: budget, chunked prefill, FCFS, preemption and resume."""
from mlxr.engine.block_manager import BlockManager
from mlxr.engine.scheduler import Scheduler, SchedulerConfig
from mlxr.engine.sequence import Sequence


def make(num_blocks=64, bs=4, budget=16, max_seqs=8, prefix=True):
    bm = BlockManager(num_blocks, bs, prefix)
    return Scheduler(SchedulerConfig(max_seqs, budget, 1024), bm), bm


def seq(n, sid, start=0):
    return Sequence(sid, f"r{sid}", 0, list(range(start, start + n)), n, float(sid))


def fake_step(sch: Scheduler, max_new: dict[int, int]):
    """Run one step: sequences that reach their last token 'sample' token 7."""
    out = sch.schedule()
    sch.update(out)
    for item in out.scheduled:
        s = item.seq
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(7)
            if s.num_output_tokens >= max_new[s.seq_id]:
                sch.finish(s, "length")
    return out


def test_budget_respected_and_prefill_chunked():
    sch, _ = make(budget=10)
    a = seq(25, 0)
    sch.add(a)
    sizes = [fake_step(sch, {0: 3}).num_batched_tokens for _ in range(3)]
    assert sizes == [10, 10, 5]
    assert a.num_output_tokens == 1


def test_decode_and_prefill_share_a_step_fcfs():
    sch, _ = make(budget=8)
    a, b = seq(3, 0), seq(20, 1)
    sch.add(a)
    sch.add(b)
    out = fake_step(sch, {0: 5, 1: 5})
    assert [(s.seq.seq_id, s.num_tokens) for s in out.scheduled] == [(0, 3), (1, 5)]
    out = fake_step(sch, {0: 5, 1: 5})
    assert [(s.seq.seq_id, s.num_tokens) for s in out.scheduled] == [(0, 1), (1, 7)]


def test_max_num_seqs_caps_running():
    sch, _ = make(max_seqs=2, budget=100)
    for i in range(4):
        sch.add(seq(3, i))
    out = fake_step(sch, {i: 10 for i in range(4)})
    assert [s.seq.seq_id for s in out.scheduled] == [0, 1]


def test_preemption_recomputes_and_everything_finishes():
    sch, bm = make(num_blocks=6, bs=4, budget=64)
    seqs = [seq(6, i, start=10 * i) for i in range(3)]
    for s in seqs:
        sch.add(s)
    steps = 0
    while sch.has_unfinished:
        fake_step(sch, {s.seq_id: 8 for s in seqs})
        steps += 1
        assert steps < 200
    assert sch.counters.num_preemptions > 0
    assert all(s.num_output_tokens == 8 and s.finish_reason == "length" for s in seqs)
    assert bm.usage().used == 0


def test_preempted_sequence_goes_back_to_the_front():
    sch, _ = make(num_blocks=4, bs=4, budget=64)
    a, b = seq(8, 0), seq(8, 1, start=100)
    sch.add(a)
    sch.add(b)
    fake_step(sch, {0: 9, 1: 9})  # both prefilled: 2 full blocks each, cache full
    out = fake_step(sch, {0: 9, 1: 9})  # a needs a 3rd block: b (latest) is preempted
    assert out.preempted == [b] and sch.waiting[0] is b
    assert b.num_computed_tokens == 0 and not b.block_table


def test_prefix_hits_counted_in_tokens():
    sch, _ = make(budget=64)
    a = seq(12, 0)
    sch.add(a)
    fake_step(sch, {0: 1})
    b = seq(12, 1)  # same tokens as a
    sch.add(b)
    out = fake_step(sch, {1: 1})
    assert out.scheduled[0].num_tokens == 4  # 8 tokens came from the cache
    assert sch.counters.prefix_hit_tokens == 8
    assert sch.counters.prefix_queried_tokens == 24


def test_swap_preemption_keeps_computed_tokens_and_finishes():
    from mlxr.engine.block_manager import SwapSpace

    bm = BlockManager(6, 4)
    sch = Scheduler(SchedulerConfig(8, 64, 1024), bm, SwapSpace(16))
    seqs = [seq(6, i, start=10 * i) for i in range(3)]
    for s in seqs:
        sch.add(s)
    swapped_out = swapped_in = 0
    while sch.has_unfinished:
        out = sch.schedule()
        swapped_out += len(out.blocks_to_swap_out)
        swapped_in += len(out.blocks_to_swap_in)
        for s in out.preempted:
            assert s.num_computed_tokens > 0 and s.host_block_table  # kept, not recomputed
        sch.update(out)
        for item in out.scheduled:
            s = item.seq
            if s.num_computed_tokens == s.num_tokens:
                s.token_ids.append(7)
                if s.num_output_tokens >= 8:
                    sch.finish(s, "length")
    assert swapped_out > 0 and swapped_in == swapped_out
    assert all(s.num_output_tokens == 8 for s in seqs)
    assert bm.usage().used == 0 and sch.swap.used == 0
