"""Host-side staging of step inputs: numpy-built tensors equal torch.tensor's, and the prefill
graphs' one-buffer layout (ids, positions, slots, block table, scalars) holds what the capture
and every replay read."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mlxr.engine.worker.input_batch import slots_for
from mlxr.engine.worker.prefill_graphs import PrefillGraphs
from mlxr.engine.worker.transfers import copy_into, host_tensor, to_device


@pytest.mark.parametrize("dtype,values", [
    (torch.long, [3, -1, 2**40, 0]), (torch.int32, [7, -2, 0]), (torch.float32, [0.5, -1e30, 3.0]),
    (torch.long, []), (torch.bool, [True, False]), (torch.long, [1.7, -1.7]), (torch.long, [[1, 2], [3, 4]]),
    (torch.float32, [np.float32(2.5), 1]),
])
def test_host_tensor_equals_torch_tensor(dtype, values):
    got = host_tensor(values, dtype)
    assert got.dtype == dtype and got.shape == torch.tensor(values, dtype=dtype).shape
    assert torch.equal(got, torch.tensor(values, dtype=dtype))


def test_host_tensor_refuses_what_does_not_fit():
    with pytest.raises((OverflowError, RuntimeError)):
        host_tensor([2**40], torch.int32)


def test_host_tensor_takes_arrays_and_tensors_and_copies_arrays():
    arr = np.arange(4)
    got = host_tensor(arr, torch.long)
    arr[0] = 9  # a copy, as torch.tensor makes
    assert got.dtype == torch.long and got.tolist() == [0, 1, 2, 3]
    assert host_tensor(np.array([1, 0]), torch.bool).dtype == torch.bool
    assert host_tensor(np.array([0.5]), torch.float16).dtype == torch.float16
    assert host_tensor(torch.arange(3, dtype=torch.int32), torch.long).dtype == torch.long
    on_cpu = to_device([1, 2], torch.long, torch.device("cpu"))
    assert on_cpu.dtype == torch.long and on_cpu.tolist() == [1, 2]


def test_copy_into_writes_a_prefix():
    dst = torch.full((6,), -1, dtype=torch.long)
    copy_into(dst, np.array([4, 5, 6]))
    assert dst.tolist() == [4, 5, 6, -1, -1, -1]


def _graphs(m: int, width: int, block_size: int, scratch: int) -> PrefillGraphs:
    g = PrefillGraphs.__new__(PrefillGraphs)  # the layout only: no model, no capture
    g.m, g.width, g.scratch_block = m, width, scratch
    g.kv = SimpleNamespace(block_size=block_size)
    g.buffer = torch.zeros(3 * m + width + 4, dtype=torch.long)
    return g


@pytest.mark.parametrize("n,start", [(1, 0), (5, 0), (16, 0), (7, 9), (64, 32), (64, 56)])  # the last: a full table
def test_prefill_graph_inputs_layout(n, start):
    bs, m, width, scratch = 4, 64, 30, 99
    g = _graphs(m, width, bs, scratch)
    table = [(13 * i + 5) % 97 for i in range(-(-(start + n) // bs))]  # scattered blocks
    tokens = [(7 * i + 3) % 1000 for i in range(n)]
    got = g._host_inputs(tokens, start, table).tolist()
    pad = m - n
    want = (tokens + [0] * pad + list(range(start, start + n)) + [0] * pad
            + slots_for(table, start, start + n, bs) + [scratch * bs] * pad
            + table + [scratch] * (width - len(table)) + [start + n, 0, n, n - 1])
    assert got == want
