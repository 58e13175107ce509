"""The engine core's loop with two client channels (one per API process): outputs go back on
the channel their request came from, the same request id on two channels names two requests,
an abort on one channel leaves the other's request running, statistics reach both."""
from __future__ import annotations

import os
import threading
import time

import pytest
import zmq

from model_fixtures import cached_llm, fixture_model
from mlxr import SamplingParams
from mlxr.engine.core.core_attach import channel_addresses
from mlxr.engine.core.core_channels import Channels
from mlxr.engine.core.core_proc import CoreLoop
from mlxr.engine.core.engine_core import EngineCore
from mlxr.engine.frontend.attached_client import AttachedClient, ProcessWatch
from mlxr.engine.records import CoreMessage, EngineCoreOutput, EngineCoreRequest, decoder
from mlxr.engine_factory import core_parts
from mlxr.types import EngineStats

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


@pytest.fixture
def two_channels(model_dir, tmp_path):
    """A real CoreLoop on a thread, serving two AttachedClients of this process."""
    from mlxr.config import EngineConfig

    parts = core_parts(model_dir, "float32", None, "cpu", None)
    core = EngineCore(parts, EngineConfig(max_num_seqs=8, num_kv_blocks=64, warm_up=False))
    addresses = channel_addresses(str(tmp_path), 2)
    ctx = zmq.Context()
    loop = CoreLoop(core, Channels(ctx, addresses), os.getppid())
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    clients = [AttachedClient(*a, start_timeout_s=30) for a in addresses]
    yield clients
    loop.request_stop()
    thread.join(10)
    for c in clients:
        c.shutdown()
    loop.channels.close()
    ctx.term()
    core.shutdown()


def _request(rid: str, prompt: list[int], max_tokens: int = 10) -> EngineCoreRequest:
    return EngineCoreRequest(rid, prompt, GREEDY, max_tokens, [], time.monotonic())


def _run(clients, until_s: float = 30.0) -> list[dict[str, list]]:
    """Step every client until each of its requests finished: [{id: [tokens..., reason]}]."""
    got = [{} for _ in clients]
    deadline = time.monotonic() + until_s
    while time.monotonic() < deadline:
        for c, mine in zip(clients, got):
            for o in c.step():
                entry = mine.setdefault(o.request_id, [[], None])
                entry[0] += o.new_token_ids
                entry[1] = entry[1] or o.finish_reason
        if all(e[1] for mine in got for e in mine.values()) and all(got):
            return got
    raise AssertionError(f"not finished: {got}")


def test_outputs_go_back_on_their_channel_and_one_id_on_two_channels_is_two_requests(two_channels, model_dir):
    prompts = [[5, 6, 7, 8], [40, 41, 42]]
    want = [o.outputs[0].token_ids for o in cached_llm(model_dir).generate(prompts, GREEDY)]
    assert want[0] != want[1]
    for client, prompt in zip(two_channels, prompts):
        client.add_requests([_request("same-id", prompt)])
    got = _run(two_channels)
    assert [g.keys() for g in got] == [{"same-id"}, {"same-id"}]
    assert [g["same-id"] for g in got] == [[want[0], "length"], [want[1], "length"]]
    assert all(c.stats().kv_blocks_total == 64 for c in two_channels)  # stats reach every channel


def test_an_abort_on_one_channel_leaves_the_same_id_on_the_other_running(two_channels):
    first, second = two_channels
    first.add_requests([_request("r", [5, 6, 7], max_tokens=200)])
    second.add_requests([_request("r", [5, 6, 7], max_tokens=6)])
    first.abort_requests(["r"])
    got = _run([second])
    assert got[0]["r"][1] == "length" and len(got[0]["r"][0]) == 6
    deadline = time.monotonic() + 10
    while second.stats().num_requests_running and time.monotonic() < deadline:
        second.step()
    assert second.stats().num_requests_running == 0  # the aborted one runs no more
    assert sum(len(o.new_token_ids) for o in first.step()) < 200


def test_every_channel_hears_when_an_abort_leaves_the_core_idle(two_channels):
    """Statistics ride on step outputs; when an abort takes the last running request no step
    follows, so the core sends a snapshot itself (else every API process would report a request
    running until the next one arrived)."""
    first, second = two_channels
    first.add_requests([_request("long", [5, 6, 7], max_tokens=250)])
    deadline = time.monotonic() + 10
    while second.stats().num_requests_running != 1 and time.monotonic() < deadline:
        first.step(), second.step()
    assert second.stats().num_requests_running == 1
    first.abort_requests(["long"])
    deadline = time.monotonic() + 5
    while second.stats().num_requests_running and time.monotonic() < deadline:
        second.step()
    assert second.stats().num_requests_running == 0
    assert sum(len(o.new_token_ids) for o in first.step()) < 250  # aborted, not finished


def test_a_process_watch_sees_a_process_that_is_not_its_child_exit():
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               "p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True)"],
                              stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    parent.wait(10)  # the sleeper is now re-parented: not our child
    watch = ProcessWatch(pid)
    try:
        assert not watch.exited()
        os.kill(pid, 9)
        deadline = time.monotonic() + 5
        while not watch.exited() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watch.exited()
    finally:
        watch.close()


def test_an_idle_channel_reads_the_latest_stats(two_channels):
    busy, idle = two_channels
    busy.add_requests([_request("r", [5, 6, 7], max_tokens=5)])
    _run([busy])
    deadline = time.monotonic() + 5
    while idle.stats() != busy.stats() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert idle.stats() == busy.stats() and idle.stats().prefix_cache_queried_tokens >= 3


def test_snapshots_to_a_client_that_does_not_read_are_dropped_not_waited_for(tmp_path):
    """Thousands of snapshots to a channel whose reader sleeps (past ZMQ's queue bounds) must not
    block the core; outputs still reach the other channel."""
    ctx = zmq.Context()
    addresses = channel_addresses(str(tmp_path), 2)
    readers = []
    for requests, outputs in addresses:
        push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
        push.bind(requests)
        pull.bind(outputs)
        readers.append((push, pull))
    channels = Channels(ctx, addresses)
    stats = EngineStats(0, 0, 0, 64, 0, 0, 0, 0, 0, 256, 0, 0)
    done = threading.Event()

    def flood() -> None:
        for _ in range(5000):
            channels.send_outputs([], stats)
        channels.send_outputs([EngineCoreOutput("0:x", [7])], stats)
        done.set()

    threading.Thread(target=flood, daemon=True).start()
    try:
        pull, message = readers[0][1], None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # channel 0 reads; channel 1 never does
            if pull.poll(100):
                message = decoder(CoreMessage).decode(pull.recv())
                if message.outputs:
                    break
        assert done.wait(5), "the core blocked on a channel nobody reads"
        assert [(o.request_id, o.new_token_ids) for o in message.outputs] == [("x", [7])]
    finally:
        channels.close()
        for push, pull in readers:
            push.close(linger=0)
            pull.close(linger=0)
        ctx.term()


def test_an_abort_on_a_core_that_just_died_does_not_raise(tmp_path):
    """The core died since the client last looked: the abort learns it and returns (nothing is
    left to abort); the next call that needs the core raises as before."""
    from mlxr.engine.frontend.core_client import ZmqClient
    from mlxr.errors import EngineDeadError

    class JustDied(ZmqClient):
        def _exit_status(self):
            return "the engine core process 1 exited with status -9"

    client = JustDied(f"ipc://{tmp_path}/requests", f"ipc://{tmp_path}/outputs")
    try:
        assert client.dead is None
        client.abort_requests(["a"])
        assert client.dead is not None and not client.alive()
        with pytest.raises(EngineDeadError):
            client.add_requests([])
    finally:
        client.close()
