"""The scheduler's fairness on a simulated device (a clock the test advances by a cost model
of each step): a short request sent 1 s after a long prompt gets its first token within 2 s
and the long prompt's own first token comes at most 20% later for it; steps follow the
measured speed; priorities order admission and prefill shares."""
from mlxr.engine.records import EngineCoreRequest, ModelRunnerOutput
from mlxr.engine.sched.block_manager import BlockManager
from mlxr.engine.sched.budget import fair_shares, prefill_shares
from mlxr.engine.sched.scheduler import Scheduler, SchedulerConfig
from mlxr.types import SamplingParams

EOS = 2
CAP = 2048  # EngineConfig's max_num_batched_tokens
TARGET_S = 0.5  # EngineConfig's step_time_target_s


class Device:
    """A step costs a fixed part, a part per token and attention over each row's context
    (about SmolLM2-135M on two shared cores: ~1,000 prompt tokens/s at short context)."""

    def __init__(self, per_token_s=1e-3, fixed_s=5e-3, attention_s=5e-8):
        self.now = 0.0
        self.per_token_s, self.fixed_s, self.attention_s = per_token_s, fixed_s, attention_s

    def clock(self) -> float:
        return self.now

    def run(self, out) -> None:
        self.now += self.fixed_s + sum(n * (self.per_token_s + self.attention_s * (start + n / 2))
                                       for start, n in zip(out.num_computed_tokens, out.num_scheduled_tokens))


def scheduler(device: Device, target_s=TARGET_S, max_seqs=64) -> Scheduler:
    return Scheduler(SchedulerConfig(max_seqs, CAP, 32768, target_s), BlockManager(4096, 16, True), clock=device.clock)


def request(rid: str, n: int, start: int, arrival: float, max_tokens=16, priority=0) -> EngineCoreRequest:
    from mlxr.engine.sched.request import Request

    return Request(EngineCoreRequest(rid, list(range(start, start + n)), SamplingParams(priority=priority),
                                     max_tokens, [EOS], arrival))


def step(sch: Scheduler, device: Device):
    """Schedule, run on the device's clock, land: each sampling row samples token 7."""
    out = sch.schedule()
    rows = [rid for rid, start, n in zip(out.request_ids, out.num_computed_tokens, out.num_scheduled_tokens)
            if start + n == sch.requests[rid].num_tokens - 1]
    device.run(out)
    return out, sch.update_from_output(out, ModelRunnerOutput(rows, [[7] for _ in rows]))


def first_token_times(sch: Scheduler, device: Device, arrivals: list) -> dict[str, float]:
    """Run requests arriving at their times (between steps, as the engine loop takes them in)
    to the end; each one's time to its first token."""
    pending = sorted(arrivals, key=lambda r: r.arrival_time)
    ttft: dict[str, float] = {}
    while pending or sch.has_unfinished:
        while pending and pending[0].arrival_time <= device.now:
            sch.add(pending.pop(0))
        if not sch.has_unfinished:
            device.now = pending[0].arrival_time
            continue
        _, outputs = step(sch, device)
        for o in outputs:
            if o.new_token_ids and o.request_id not in ttft:
                ttft[o.request_id] = device.now - sch_arrival(arrivals, o.request_id)
    return ttft


def sch_arrival(arrivals, rid: str) -> float:
    return next(r.arrival_time for r in arrivals if r.request_id == rid)


def test_a_short_request_behind_an_8k_prompt_gets_its_first_token_within_2s():
    solo = Device()
    alone = first_token_times(scheduler(solo), solo, [request("long", 8192, 10, 0.0)])
    device = Device()
    both = first_token_times(scheduler(device), device,
                             [request("long", 8192, 10, 0.0), request("short", 16, 20000, 1.0)])
    assert alone["long"] > 8  # the prompt takes ~10 s on this device
    assert both["short"] < 2.0, both
    assert both["long"] <= 1.2 * alone["long"], (both, alone)


def test_without_a_step_target_the_short_request_waits_for_the_whole_prompt():
    """The budget alone (no target time): 2,048-token steps of ~2.5 s each, and the short
    request's first token comes seconds later than with the target."""
    device = Device()
    ttft = first_token_times(scheduler(device, target_s=0.0), device,
                             [request("long", 8192, 10, 0.0), request("short", 16, 20000, 1.0)])
    assert ttft["short"] > 2.0


def test_steps_follow_the_measured_speed():
    """On a device twice slower, steps hold half the tokens; on a fast one they take the whole
    budget; on a very slow one the least step (128 tokens)."""
    sizes = {}
    for per_token_s in (1e-3, 2e-3, 1e-5, 1e-1):
        device = Device(per_token_s=per_token_s, attention_s=0.0, fixed_s=0.0)
        sch = scheduler(device)
        sch.add(request("long", 30000, 10, 0.0))
        steps = [step(sch, device)[0].num_batched_tokens for _ in range(8)]
        sizes[per_token_s] = steps[-1]
    assert abs(sizes[1e-3] - 500) <= 25 and abs(sizes[2e-3] - 250) <= 15
    assert sizes[1e-5] == CAP and sizes[1e-1] == 128


def test_the_first_step_before_any_timing_is_small():
    device = Device()
    sch = scheduler(device)
    sch.add(request("long", 8192, 10, 0.0))
    assert step(sch, device)[0].num_batched_tokens == 256


def test_running_decodes_ride_every_step_of_a_long_prefill():
    """A chat decoding when an 8k prompt arrives gets a token every step, and once the speed
    is measured no step (the gap between its tokens) runs far past the target."""
    device = Device()
    sch = scheduler(device)
    sch.add(request("chat", 20, 30000, 0.0, max_tokens=64))
    step(sch, device)
    sch.add(request("long", 8192, 10, device.now))
    for i in range(12):
        before = device.now
        out, _ = step(sch, device)
        assert "chat" in out.request_ids and "long" in out.request_ids
        if i >= 2:
            assert device.now - before < 1.25 * TARGET_S


def test_two_long_prompts_share_the_prefill_part_equally():
    device = Device()
    sch = scheduler(device)
    sch.add(request("a", 8000, 10, 0.0))
    sch.add(request("b", 8000, 9000, 0.0))
    for _ in range(4):
        out, _ = step(sch, device)
    counts = dict(zip(out.request_ids, out.num_scheduled_tokens))
    assert abs(counts["a"] - counts["b"]) <= 1


def test_a_lower_priority_value_is_admitted_and_prefilled_first():
    device = Device()
    sch = scheduler(device, max_seqs=1)
    sch.add(request("late", 600, 10, 0.0, priority=5))
    sch.add(request("urgent", 600, 5000, 1.0, priority=-1))
    assert [r.request_id for r in sch.waiting] == ["urgent", "late"]
    out, _ = step(sch, device)
    assert out.request_ids == ["urgent"]


def test_priority_classes_fill_in_order_and_share_fairly_within():
    assert fair_shares([10, 500, 500], 410) == [10, 200, 200]
    assert prefill_shares([(0, 300), (1, 300), (0, 300)], 400) == [200, 0, 200]
    assert prefill_shares([(0, 50), (1, 300)], 400) == [50, 300]
    assert prefill_shares([(0, 100)] * 100, 64) == [16, 16, 16, 16] + [0] * 96  # no 1-token rows


def test_a_burst_of_short_prompts_joins_one_step():
    """32 four-token prompts on an idle engine: all admitted in the first step (each needs less
    than a row's least share), not a few per step."""
    device = Device()
    sch = scheduler(device)
    for i in range(32):
        sch.add(request(f"r{i}", 4, 100 * i + 10, 0.0))
    out, _ = step(sch, device)
    assert len(out.request_ids) == 32


def test_one_slow_step_barely_shrinks_the_next():
    """A step 100 times slower than the rest (a kernel compiled on first use) counts as four
    times the average at most: the steps after it still take most of the target's tokens."""
    device = Device(attention_s=0.0)
    sch = scheduler(device)
    sch.add(request("long", 30000, 10, 0.0))
    for _ in range(6):
        step(sch, device)
    settled = step(sch, device)[0].num_batched_tokens
    out = sch.schedule()
    device.now += 100 * (device.fixed_s + device.per_token_s * out.num_batched_tokens)
    rows = [rid for rid, start, n in zip(out.request_ids, out.num_computed_tokens, out.num_scheduled_tokens)
            if start + n == sch.requests[rid].num_tokens - 1]
    sch.update_from_output(out, ModelRunnerOutput(rows, [[7] for _ in rows]))
    assert step(sch, device)[0].num_batched_tokens >= settled // 2
