"""The worker's M-RoPE positions (engine/worker/mrope_positions.py) against transformers'
Qwen2_5_VLModel.get_rope_index on a prompt of three images of different grids, computed in
chunks of every size (as chunked prefill and decode steps ask for them), and past the prompt
(decode: the prompt's last position plus the rope delta)."""
from __future__ import annotations

import types

import pytest
import torch

from mlxr.engine.records import NewRequestData, SchedulerOutput
from mlxr.engine.worker.mrope_positions import MRopePositions
from mlxr.types import ImageInput, SamplingParams

IMAGE = 9
# (offset, merged grid h, w): a wide image, a tall one, a square one, text around and between
LAYOUT = [(3, 2, 5), (15, 4, 1), (21, 3, 3)]
PROMPT = 34


def _hf_positions(ids: torch.Tensor, grids: list[tuple[int, int, int]]) -> tuple[torch.Tensor, int]:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    fake = types.SimpleNamespace(config=types.SimpleNamespace(
        vision_config=types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=2)))
    fake.get_vision_position_ids = types.MethodType(Qwen2_5_VLModel.get_vision_position_ids, fake)
    pos, delta = Qwen2_5_VLModel.get_rope_index(fake, ids[None], (ids == IMAGE).int()[None],
                                                 image_grid_thw=torch.tensor(grids))
    return pos[:, 0], int(delta)


@pytest.mark.parametrize("chunk", [1, 2, 5, 7, PROMPT])
def test_positions_equal_get_rope_index_in_any_chunks(chunk):
    ids = torch.zeros(PROMPT, dtype=torch.long)
    images = []
    for offset, h, w in LAYOUT:
        ids[offset:offset + h * w] = IMAGE
        images.append(ImageInput(b"", offset, h * w, b"", [3, h * 8, w * 8]))
    want, delta = _hf_positions(ids, [(1, 2 * h, 2 * w) for _, h, w in LAYOUT])
    mrope = MRopePositions(8, torch.device("cpu"))
    mrope.update(SchedulerOutput(new_requests=[NewRequestData("r", ids.tolist(), PROMPT, SamplingParams(), [], [],
                                                              images)]))
    got = torch.cat([mrope.for_step(SchedulerOutput(request_ids=["r"], num_computed_tokens=[s]), [min(chunk, PROMPT - s)])
                     for s in range(0, PROMPT, chunk)], dim=1)
    assert torch.equal(got, want)
    after = mrope.for_step(SchedulerOutput(request_ids=["r"], num_computed_tokens=[PROMPT + 3]), [1])
    assert after.flatten().tolist() == [PROMPT + 3 + delta] * 3 and delta < 0
