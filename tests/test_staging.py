"""Host-side staging of step inputs: numpy-built tensors equal torch.tensor's, and the prefill
graphs' one-buffer layout (ids, positions, slots, block table, scalars) holds what the capture
and every replay read."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mlxr.engine.input_batch import slots_for
from mlxr.engine.prefill_graphs import PrefillGraphs
from mlxr.engine.staging import copy_into, host_tensor, to_device


@pytest.mark.parametrize("dtype,values", [
    (torch.long, [3, -1, 2**40, 0]), (torch.int32, [7, -2, 0]), (torch.float32, [0.5, -1e30, 3.0]),
    (torch.long, []), (torch.bool, [True, False]),
])
def test_host_tensor_equals_torch_tensor(dtype, values):
    got = host_tensor(values, dtype)
    assert got.dtype == dtype
    assert torch.equal(got, torch.tensor(values, dtype=dtype))


def test_host_tensor_takes_arrays_and_tensors():
    assert torch.equal(host_tensor(np.arange(4), torch.long), torch.arange(4))
    assert host_tensor(torch.arange(3, dtype=torch.int32), torch.long).dtype == torch.long
    assert torch.equal(to_device([1, 2], torch.long, torch.device("cpu")), torch.tensor([1, 2]))


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


@pytest.mark.parametrize("n,start", [(1, 0), (5, 0), (16, 0), (7, 9), (64, 32)])
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
