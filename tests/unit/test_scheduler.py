"""Scheduler with fake runner outputs (no model): budget, chunked prefill, FCFS, preemption,
resume, tokens in flight as counts, rows of several sampled tokens, finishing decided here."""
from mlxr.engine.records import EngineCoreRequest, ModelRunnerOutput, SchedulerOutput
from mlxr.engine.sched.block_manager import BlockManager, SwapSpace
from mlxr.engine.sched.request import Request
from mlxr.engine.sched.scheduler import Scheduler, SchedulerConfig
from mlxr.types import SamplingParams

EOS = 2


def make(num_blocks=64, bs=4, budget=16, max_seqs=8, prefix=True, swap=None):
    bm = BlockManager(num_blocks, bs, prefix)
    return Scheduler(SchedulerConfig(max_seqs, budget, 1024), bm, swap), bm


def req(n, rid, start=10, max_tokens=8, **params):
    return Request(EngineCoreRequest(f"r{rid}", list(range(start, start + n)), SamplingParams(**params),
                   max_tokens, [EOS], float(rid)))


def sampled_rows(sch: Scheduler, out: SchedulerOutput) -> list[str]:
    """The rows of out that sample (one step in flight at a time): those that put a token in flight."""
    return [rid for rid, start, n in zip(out.request_ids, out.num_computed_tokens, out.num_scheduled_tokens)
            if rid in sch.requests and start + n == sch.requests[rid].num_tokens - 1]


def fake_step(sch: Scheduler, token=7):
    """Schedule, then land: each sampling row 'samples' token."""
    out = sch.schedule()
    rows = sampled_rows(sch, out)
    result = ModelRunnerOutput(rows, [[token] for _ in rows])
    return out, sch.update_from_output(out, result)


def rows(out: SchedulerOutput) -> list[tuple[str, int]]:
    return list(zip(out.request_ids, out.num_scheduled_tokens))


def test_budget_respected_and_prefill_chunked():
    sch, _ = make(budget=10)
    a = req(25, 0, max_tokens=3)
    sch.add(a)
    sizes = [fake_step(sch)[0].num_batched_tokens for _ in range(3)]
    assert sizes == [10, 10, 5]
    assert a.num_output_tokens == 1 and a.output_token_ids == [7]


def test_decode_and_prefill_share_a_step_fcfs():
    sch, _ = make(budget=8)
    sch.add(req(3, 0))
    sch.add(req(20, 1))
    out, _ = fake_step(sch)
    assert rows(out) == [("r0", 3), ("r1", 5)]
    out, _ = fake_step(sch)
    assert rows(out) == [("r0", 1), ("r1", 7)]


def test_new_requests_data_is_sent_once_then_counts_and_new_blocks():
    sch, _ = make(budget=64, bs=4)
    sch.add(req(3, 0, max_tokens=8))
    out, _ = fake_step(sch)
    assert [n.request_id for n in out.new_requests] == ["r0"] and out.new_requests[0].token_ids == [10, 11, 12]
    out, _ = fake_step(sch)  # position 3: still the first block
    assert out.new_requests == [] and out.new_block_ids == {} and rows(out) == [("r0", 1)]
    out, _ = fake_step(sch)  # position 4 enters a second block
    assert list(out.new_block_ids) == ["r0"] and len(out.new_block_ids["r0"]) == 1


def test_max_num_seqs_caps_running():
    sch, _ = make(max_seqs=2, budget=100)
    for i in range(4):
        sch.add(req(3, i))
    out, _ = fake_step(sch)
    assert out.request_ids == ["r0", "r1"]


def test_overlap_schedules_the_token_in_flight_and_never_past_max_tokens():
    """Scheduled before the last step landed: the in-flight token is the next step's input
    (a count, not a stand-in token), and a request whose last token is in flight waits."""
    sch, _ = make(budget=64)
    a = req(3, 0, max_tokens=2)
    sch.add(a)
    first = sch.schedule()
    assert a.num_in_flight == 1 and a.num_tokens == 4 and a.token_ids == [10, 11, 12]
    second = sch.schedule()  # before the first landed
    assert rows(second) == [("r0", 1)] and second.num_computed_tokens == [3] and a.num_in_flight == 2
    assert sch.schedule().is_empty  # both of its max_tokens are in flight
    sch.update_from_output(first, ModelRunnerOutput(["r0"], [[40]]))
    assert a.token_ids == [10, 11, 12, 40] and not a.is_finished
    outs = sch.update_from_output(second, ModelRunnerOutput(["r0"], [[41]]))
    assert outs[0].new_token_ids == [41] and outs[0].finish_reason == "length" and a.is_finished


def test_the_scheduler_finishes_on_eos_and_stop_token_ids():
    sch, bm = make(budget=64)
    a, b, c = req(3, 0), req(3, 1, stop_token_ids=[9]), req(3, 2, ignore_eos=True)
    for r in (a, b, c):
        sch.add(r)
    out = sch.schedule()
    got = {o.request_id: o for o in sch.update_from_output(out, ModelRunnerOutput(["r0", "r1", "r2"], [[EOS], [9], [EOS]]))}
    assert got["r0"].finish_reason == "stop" and got["r0"].new_token_ids == [EOS] and got["r0"].stop_reason is None
    assert got["r1"].finish_reason == "stop" and got["r1"].stop_reason == 9
    assert got["r2"].finish_reason is None and not c.is_finished
    assert set(sch.requests) == {"r2"} and out.finished_request_ids == []
    assert sch.schedule().finished_request_ids == ["r0", "r1"]  # the runner forgets them next step


def test_a_row_of_several_tokens_lands_them_all_and_stops_at_a_stop_token():
    """Speculative rows: several sampled ids land at once; those past a stop are dropped."""
    sch, _ = make(budget=64)
    a, b = req(3, 0, max_tokens=10), req(3, 1, max_tokens=10)
    sch.add(a)
    sch.add(b)
    out = sch.schedule()
    a.num_in_flight = b.num_in_flight = 3  # as a verifier accepting 2 drafts + a bonus token would
    got = {o.request_id: o for o in sch.update_from_output(out, ModelRunnerOutput(["r0", "r1"], [[5, 6, 7], [5, EOS, 8]]))}
    assert got["r0"].new_token_ids == [5, 6, 7] and a.output_token_ids == [5, 6, 7] and a.num_in_flight == 0
    assert got["r1"].new_token_ids == [5, EOS] and got["r1"].finish_reason == "stop" and b.is_finished


def test_rows_of_finished_or_aborted_requests_are_dropped():
    sch, bm = make(budget=64)
    sch.add(req(3, 0))
    out = sch.schedule()
    sch.abort(["r0"])
    assert bm.usage().used == 0
    assert sch.update_from_output(out, ModelRunnerOutput(["r0"], [[5]])) == []


def test_preemption_recomputes_and_everything_finishes():
    sch, bm = make(num_blocks=6, bs=4, budget=64)
    reqs = [req(6, i, start=10 * i + 10) for i in range(3)]
    for r in reqs:
        sch.add(r)
    steps = 0
    while sch.has_unfinished:
        fake_step(sch)
        steps += 1
        assert steps < 200
    assert sch.counters.num_preemptions > 0
    assert all(r.num_output_tokens == 8 and r.finish_reason == "length" for r in reqs)
    assert bm.usage().used == 0


def test_preempted_request_goes_back_to_the_front_and_is_resent_whole():
    sch, _ = make(num_blocks=4, bs=4, budget=64)
    a, b = req(8, 0, max_tokens=9), req(8, 1, start=100, max_tokens=9)
    sch.add(a)
    sch.add(b)
    fake_step(sch)  # both prefilled: 2 full blocks each, cache full
    out, _ = fake_step(sch)  # a needs a 3rd block: b (latest) is preempted
    assert out.preempted_request_ids == ["r1"] and sch.waiting[0] is b
    assert b.num_computed_tokens == 0 and not b.block_table
    sch.abort(["r0"])
    out, _ = fake_step(sch)
    assert [n.request_id for n in out.new_requests] == ["r1"]
    assert out.new_requests[0].token_ids == list(range(100, 108)) + [7]  # prompt and its output


def test_preemption_takes_the_lowest_priority_first_even_when_it_already_ran_this_step():
    """vLLM's priority policy: the largest priority value goes first, here the earlier-admitted
    request, already scheduled in this step: it leaves the step (its row and its budget)."""
    sch, bm = make(num_blocks=4, bs=4, budget=64)
    low, high = req(5, 0, max_tokens=9, priority=5), req(8, 1, start=100, max_tokens=9, priority=0)
    sch.add(low)
    fake_step(sch)  # low alone: 2 blocks
    sch.add(high)
    fake_step(sch)  # high prefilled (2 blocks, the cache full); running: low, then high
    out, _ = fake_step(sch)  # low's 8th token fits its blocks (scheduled); high's 9th needs a 3rd
    assert out.preempted_request_ids == ["r0"] and sch.waiting[0] is low
    assert rows(out) == [("r1", 1)] and "r0" not in out.new_block_ids
    assert low.num_computed_tokens == 0 and not low.block_table and len(high.block_table) == 3
    while sch.has_unfinished:
        fake_step(sch)
    assert low.num_output_tokens == high.num_output_tokens == 9 and bm.usage().used == 0


def test_equal_priorities_still_preempt_the_latest_admitted():
    sch, _ = make(num_blocks=6, bs=4, budget=64)
    reqs = [req(8, i, start=10 * i + 10, max_tokens=9) for i in range(3)]
    for r in reqs[:2]:
        sch.add(r)
    fake_step(sch)
    sch.add(reqs[2])
    out, _ = fake_step(sch)
    assert out.preempted_request_ids in ([], ["r1"], ["r2"])
    seen = set(out.preempted_request_ids)
    while sch.has_unfinished:
        out, _ = fake_step(sch)
        seen |= set(out.preempted_request_ids)
    assert "r0" not in seen  # the first admitted is never the victim while later ones run


def test_prefix_hits_counted_in_tokens():
    sch, _ = make(budget=64)
    sch.add(req(12, 0, max_tokens=1))
    fake_step(sch)
    sch.add(req(12, 1))  # same tokens
    out, _ = fake_step(sch)
    assert rows(out) == [("r1", 4)] and out.num_computed_tokens == [8]  # 8 tokens from the cache
    assert sch.counters.prefix_hit_tokens == 8
    assert sch.counters.prefix_queried_tokens == 24


def test_swap_preemption_keeps_computed_tokens_and_finishes():
    sch, bm = make(num_blocks=6, bs=4, budget=64, swap=SwapSpace(16))
    reqs = [req(6, i, start=10 * i + 10) for i in range(3)]
    for r in reqs:
        sch.add(r)
    swapped_out = swapped_in = 0
    while sch.has_unfinished:
        out, _ = fake_step(sch)
        swapped_out += len(out.blocks_to_swap_out)
        swapped_in += len(out.blocks_to_swap_in)
        for rid in out.preempted_request_ids:
            r = sch.requests[rid]
            assert r.num_computed_tokens > 0 and r.host_block_table  # kept, not recomputed
    assert swapped_out > 0 and swapped_in == swapped_out
    assert all(r.num_output_tokens == 8 for r in reqs)
    assert bm.usage().used == 0 and sch.swap.used == 0


def test_draft_tokens_ride_a_decode_row_and_rejected_ones_roll_back_by_counts():
    """Speculative decoding's slot: a decode row carries its draft tokens; of 3 drafts the
    verifier accepted 1 and added its own token: 2 tokens land, and the computed count steps
    back over the 2 rejected positions (their KV is overwritten later, nothing is copied)."""
    sch, _ = make(budget=64)
    a = req(4, 0, max_tokens=10)
    sch.add(a)
    fake_step(sch)  # prompt computed (4), first token landed: 5 tokens, 4 computed
    a.spec_token_ids = [50, 51, 52]
    out = sch.schedule()
    assert rows(out) == [("r0", 4)] and out.spec_token_ids == {"r0": [50, 51, 52]}
    assert a.num_computed_tokens == 8 and a.num_in_flight == 4
    got = sch.update_from_output(out, ModelRunnerOutput(["r0"], [[50, 60]]))
    assert got[0].new_token_ids == [50, 60] and a.output_token_ids == [7, 50, 60]
    assert a.num_in_flight == 0 and a.num_computed_tokens == 6 and a.num_tokens == 7
    nxt = sch.schedule()
    assert rows(nxt) == [("r0", 1)] and nxt.num_computed_tokens == [6] and nxt.spec_token_ids == {}


def test_drafts_never_go_past_max_tokens():
    sch, _ = make(budget=64)
    a = req(4, 0, max_tokens=3)
    sch.add(a)
    fake_step(sch)
    a.spec_token_ids = [50, 51, 52, 53]
    out = sch.schedule()
    assert out.spec_token_ids == {"r0": [50]}  # 1 output + 1 draft + the verifier's token = 3


def test_a_request_swapped_out_while_its_step_is_in_flight_lands_and_resumes():
    """With overlap the next step is scheduled before the last one lands, so a request can be
    swapped out while its prompt chunk is still running: landing that step must not touch the
    blocks it no longer holds (an IndexError from commit_full_blocks before), and once swapped
    back in it finishes with all its tokens. (Found by a review's random scheduler test.)"""
    bm = BlockManager(4, 4, True)
    sch = Scheduler(SchedulerConfig(8, 12, 16), bm, SwapSpace(16))  # max_model_len: the cache's 16 tokens
    a, b = req(5, 0, start=1, max_tokens=3), req(12, 1, start=100, max_tokens=3)
    sch.add(a)
    sch.add(b)
    s1 = sch.schedule()
    in_flight = (s1, _samplers(sch, s1))
    s2 = sch.schedule()  # step 1 still in flight
    assert s2.preempted_request_ids == ["r1"] and b.block_table == [] and 4 <= b.num_computed_tokens < 12  # a full block computed
    out = s2
    for _ in range(40):  # overlapped: schedule the next step, then land the one before
        nxt = (out, _samplers(sch, out))
        sch.update_from_output(in_flight[0], ModelRunnerOutput(in_flight[1], [[7]] * len(in_flight[1])))
        in_flight = nxt
        if not sch.has_unfinished:
            break
        out = sch.schedule()
    assert a.num_output_tokens == 3 and b.num_output_tokens == 3
    assert bm.usage().used == 0 and sch.swap.used == 0


def _samplers(sch: Scheduler, out: SchedulerOutput) -> list[str]:
    """The rows of a just-scheduled step that sample (its last position reaches past the landed tokens)."""
    return [rid for rid, start, n in zip(out.request_ids, out.num_computed_tokens, out.num_scheduled_tokens)
            if start + n >= len(sch.requests[rid].token_ids)]


def test_a_preempted_request_drops_its_drafts():
    """Drafts are proposed for one step: a request preempted in it (here B, to make room for A)
    drops them, so after it resumes they never ride a row they were not made for (one whose
    token is still in flight, which the runner refuses). (Found by a review's scheduler fuzzer.)"""
    bm = BlockManager(4, 4, False)
    sch = Scheduler(SchedulerConfig(8, 64, 16), bm)
    a, b = req(8, 0, start=10), req(7, 1, start=30)
    sch.add(a)
    sch.add(b)
    s1 = sch.schedule()
    sch.update_from_output(s1, ModelRunnerOutput(["r0", "r1"], [[40], [41]]))  # every block in use
    a.spec_token_ids, b.spec_token_ids = [50], [60, 61]
    s2 = sch.schedule()  # A needs a third block: B, the latest, is preempted
    assert s2.preempted_request_ids == ["r1"] and s2.spec_token_ids == {"r0": [50]}
    assert b.spec_token_ids == []
    sch.update_from_output(s2, ModelRunnerOutput(["r0"], [[EOS]]))  # A ends: room for B again
    sch.schedule()
    s4 = sch.schedule()  # overlapped: B's token from the step before is still in flight
    assert "r1" in s4.request_ids and s4.spec_token_ids == {}
