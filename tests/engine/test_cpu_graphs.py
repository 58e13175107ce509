"""CPU decode graphs: a forward recorded as its native calls (mlxr/ops/cpu/cpu_plan.py) and replayed by
the engine on the CPU (mlxr/engine/worker/cpu_graphs.py). Replays must give the eager path's bits."""
from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn.functional as F

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from mlxr.engine.worker.cpu_graphs import CPU_GRAPH_MAX_ROWS, CpuDecodeGraphs
from mlxr.ops.cpu.cpu_plan import PlanUnsupported, record
from mlxr.ops.norm.norm_cpu import rms_norm_cpu


def _norm_then_silu(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    normed, _ = rms_norm_cpu(x, w, 1e-6, False, None)  # a native call
    y = F.silu(normed) * 2.0  # torch ops that compute: repeated, results copied back
    out[:, :2].copy_(y[:, :2])  # an in-place op: repeated as it is
    return y.view(-1)  # a view: nothing to repeat


@torch.inference_mode()
def test_replay_repeats_native_calls_and_torch_ops_on_new_contents():
    x, w, out = torch.randn(3, 16), torch.rand(16) + 0.5, torch.zeros(3, 4)
    _norm_then_silu(x, w, out)  # loads the library: record() refuses one loading while it records
    plan = record(lambda: _norm_then_silu(x, w, out))
    assert plan.native_calls == 1
    x.copy_(torch.randn(3, 16))
    out.zero_()
    plan.replay()
    expected_out = torch.zeros(3, 4)
    expected = _norm_then_silu(x, w, expected_out)
    assert torch.equal(plan.result, expected)
    assert torch.equal(out, expected_out)


@torch.inference_mode()
def test_a_constant_changed_in_place_starts_from_its_value_at_each_replay():
    x = torch.randn(4)

    def scaled():
        c = torch.tensor([2.0])
        c.add_(1.0)
        return x * c

    plan = record(scaled)
    for _ in range(2):
        plan.replay()
        assert torch.equal(plan.result, x * 3.0)


@torch.inference_mode()
def test_a_functional_op_in_place_is_repeated():
    x, y = torch.randn(6), torch.empty(6)
    plan = record(lambda: F.silu(y.copy_(x), inplace=True))  # returns y itself: no view to skip
    x.copy_(torch.randn(6))
    plan.replay()
    assert torch.equal(y, F.silu(x))


@torch.inference_mode()
def test_a_forward_that_reads_values_on_the_host_is_refused():
    x = torch.randn(4)

    def branchy():
        return x * 2 if x.sum().item() > 0 else x * 3

    with pytest.raises(PlanUnsupported, match="item"):
        record(branchy)


def test_a_kernel_that_fails_in_a_replay_raises():
    from mlxr.ops.cpu.cpu_plan import NativePlan

    statuses = iter([3])
    plan = NativePlan()
    plan.add_native(lambda *args: next(statuses), (1, 2), 0)  # returned 0 (success) when recorded
    with pytest.raises(RuntimeError, match="failed"):
        plan.replay()


@torch.inference_mode()
def test_another_threads_native_calls_stay_out_of_a_recording():
    """A server runs two models' steps on two threads: one's calls while the other records must
    not enter the other's plan (its replays would rerun them on buffers long freed)."""
    x, w, out = torch.randn(3, 16), torch.rand(16) + 0.5, torch.zeros(3, 4)
    _norm_then_silu(x, w, out)
    asked, answered = threading.Event(), threading.Event()

    def other_model_step():
        asked.wait()
        with torch.inference_mode():
            rms_norm_cpu(torch.randn(2, 16), w, 1e-6, False, None)
        answered.set()

    def recorded():
        asked.set()
        assert answered.wait(30)  # the other thread's call falls inside this recording
        return _norm_then_silu(x, w, out)

    other = threading.Thread(target=other_model_step)
    other.start()
    plan = record(recorded)
    other.join()
    assert plan.native_calls == 1


def _library_functions() -> dict:
    from mlxr.ops.cpu.cpu_build import loaded_libraries
    return {(id(lib), name): f for lib in loaded_libraries() for name, f in vars(lib).items() if callable(f)}


@torch.inference_mode()
def test_two_threads_recording_at_once_leave_the_libraries_as_they_were():
    x, w, out = torch.randn(3, 16), torch.rand(16) + 0.5, torch.zeros(3, 4)
    _norm_then_silu(x, w, out)
    before = _library_functions()
    first_recording, first_done = threading.Event(), threading.Event()
    plans = {}

    def second():
        first_recording.wait()
        with torch.inference_mode():
            # Ends after the first: without turns, it would put the first's recorders back for good.
            plans["second"] = record(lambda: (first_done.wait(30), _norm_then_silu(x, w, out))[1])

    def first_fn():
        first_recording.set()
        time.sleep(0.2)  # the second starts recording meanwhile (or waits its turn)
        return _norm_then_silu(x, w, out)

    thread = threading.Thread(target=second)
    thread.start()
    plans["first"] = record(first_fn)
    first_done.set()
    thread.join()
    assert _library_functions() == before
    assert plans["first"].native_calls == plans["second"].native_calls == 1


def _greedy(model: str, graphs: bool, prompts: list[list[int]], n: int = 24) -> list[list[int]]:
    llm = LLM(model, dtype=torch.float32, device="cpu", max_num_seqs=len(prompts), enable_prefix_caching=False,
              enable_cpu_graphs=graphs)
    runner = llm.engine.core.core.runner
    assert isinstance(runner.graphs, CpuDecodeGraphs) == graphs
    replays = []
    if graphs:
        original = runner.graphs.run
        runner.graphs.run = lambda *a, **k: (replays.append(1), original(*a, **k))[1]
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert (len(replays) >= n - 1) == graphs  # every decode step replayed
    return outs


PROMPTS = [[1, 5, 9, 13], [2, 7, 3, 11, 19, 23], [4, 6]]


@pytest.mark.parametrize("name,gguf_type", [("tiny-llama", "q8_0"), ("tiny-gemma3", "q8_0"), ("tiny-qwen2", None)])
def test_greedy_tokens_are_the_eager_tokens(name, gguf_type):
    paths = fixture_model(name, gguf_type)
    model = str(paths.gguf_path if gguf_type else paths.hf_dir)
    assert _greedy(model, True, PROMPTS) == _greedy(model, False, PROMPTS)


def test_bundled_smollm2_greedy_tokens_are_the_eager_tokens():
    """Q4_1 layers and a tied Q8_0 lm_head and embedding: the integer kernels' paths."""
    from mlxr.bundled_models import smollm2_135m_path

    prompts = [[p + 100 for p in prompt] for prompt in PROMPTS]
    assert _greedy(str(smollm2_135m_path()), True, prompts) == _greedy(str(smollm2_135m_path()), False, prompts)


def test_sizes_cover_every_row_count_up_to_the_bound():
    from mlxr.engine.worker.cpu_graphs import cpu_graph_sizes

    assert cpu_graph_sizes(3) == [1, 2, 3]
    assert cpu_graph_sizes(64) == list(range(1, CPU_GRAPH_MAX_ROWS + 1))


def test_a_new_thread_count_records_the_graphs_again():
    """The kernels take the thread count as an argument, so a recording keeps the count it was
    made with; a step after torch.set_num_threads (Ollama's num_thread) records anew."""
    paths = fixture_model("tiny-llama", "q8_0")
    before = torch.get_num_threads()
    llm = LLM(str(paths.gguf_path), dtype=torch.float32, device="cpu", max_num_seqs=2, enable_prefix_caching=False)
    graphs = llm.engine.core.core.runner.graphs
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    want = llm.generate([PROMPTS[0]], params)[0].outputs[0].token_ids
    try:
        torch.set_num_threads(1 if before > 1 else 2)
        got = llm.generate([PROMPTS[0]], params)[0].outputs[0].token_ids
        assert graphs.threads == torch.get_num_threads() and graphs.graphs
    finally:
        torch.set_num_threads(before)
    assert got == want
