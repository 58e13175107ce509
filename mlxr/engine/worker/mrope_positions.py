"""M-RoPE positions (Qwen2.5-VL) of a step's rows, as transformers' get_rope_index gives them: an
image's tokens at (base, base + row, base + column) of its merged grid, base being where the
image starts; text tokens at one position thrice, each image before them having moved the count
by (the larger grid side) - (its tokens), the "rope delta" decode steps keep adding. Kept per
request with images for its whole life (its decode steps need the delta); requests without
images never reach here (their positions are plain)."""
from __future__ import annotations

import numpy as np
import torch

from mlxr.engine.records import SchedulerOutput


class MRopePositions:
    def __init__(self, merged_side: int, device: torch.device) -> None:
        self.merged_side, self.device = merged_side, device  # pixels a token covers a side (patch x merge)
        self.layouts: dict[str, list[tuple[int, int, int]]] = {}  # request -> (offset, length, grid width) each image
        self.shifts: dict[str, list[int]] = {}  # request -> the delta after each image

    def update(self, out: SchedulerOutput) -> None:
        for rid in (*out.finished_request_ids, *out.preempted_request_ids):
            self.layouts.pop(rid, None)
            self.shifts.pop(rid, None)
        for new in out.new_requests:
            self.layouts.pop(new.request_id, None)
            self.shifts.pop(new.request_id, None)
            if new.images:
                self._add(new.request_id, new.images)

    def _add(self, rid: str, images) -> None:
        layout, shifts, delta = [], [], 0
        for im in sorted(images, key=lambda im: im.offset):
            gh, gw = im.shape[1] // self.merged_side, im.shape[2] // self.merged_side
            layout.append((im.offset, im.length, gw))
            delta += max(gh, gw) - im.length
            shifts.append(delta)
        self.layouts[rid], self.shifts[rid] = layout, shifts

    def needed(self, out: SchedulerOutput) -> bool:
        layouts = self.layouts
        return bool(layouts) and any(rid in layouts for rid in out.request_ids)

    def for_step(self, out: SchedulerOutput, query_lens: list[int]) -> torch.Tensor:
        """[3, T] positions of the step's rows in order (query_lens: each row's tokens)."""
        parts = [self._row(rid, start, n) for rid, start, n in zip(out.request_ids, out.num_computed_tokens, query_lens)]
        return torch.from_numpy(np.concatenate(parts, axis=1)).to(self.device)

    def _row(self, rid: str, start: int, n: int) -> np.ndarray:
        p = np.arange(start, start + n, dtype=np.int64)
        layout = self.layouts.get(rid)
        if layout is None:
            return np.broadcast_to(p, (3, n)).copy()
        out = np.broadcast_to(p, (3, n)).copy()
        before = 0  # the delta of the images ending before the current one
        for (offset, length, gw), shift in zip(layout, self.shifts[rid]):
            out[:, p >= offset + length] = (p[p >= offset + length] + shift)
            inside = (p >= offset) & (p < offset + length)
            local = p[inside] - offset
            base = offset + before
            out[0, inside], out[1, inside], out[2, inside] = base, base + local // gw, base + local % gw
            before = shift
        return out
