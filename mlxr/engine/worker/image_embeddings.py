"""Image embeddings for the rows of a step: each image run through the model's vision tower once
per request (batched with the other images the step needs), kept until its tokens are computed,
then dropped. A vision model module the runner calls before the language model's forward; the
text-only path never reaches here (the runner holds none of this for a text-only model)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from mlxr.engine.records import ImageInput, SchedulerOutput


@dataclass
class StepImages:
    """What one step's forward needs: flat rows of image tokens, their embeddings, and per
    sequence the image spans its queries touch (for bidirectional attention)."""

    rows: torch.Tensor  # [R] int64
    embeddings: torch.Tensor  # [R, hidden]
    spans: list[list[tuple[int, int]]]


class ImageEmbeddings:
    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.bidirectional = model.args.vision.bidirectional
        self.images: dict[str, list[ImageInput]] = {}  # requests with image tokens not yet computed
        self.encoded: dict[tuple[str, int], torch.Tensor] = {}  # (request, image index) -> [tokens, hidden]
        self.encoder_calls = 0  # images run through the tower

    def update(self, out: SchedulerOutput) -> None:
        for rid in (*out.finished_request_ids, *out.preempted_request_ids):
            self._forget(rid)
        for new in out.new_requests:
            self._forget(new.request_id)
            if new.images:
                self.images[new.request_id] = list(new.images)

    def needed(self, out: SchedulerOutput) -> bool:
        images = self.images
        return bool(images) and any(rid in images for rid in out.request_ids)

    def for_step(self, out: SchedulerOutput) -> StepImages | None:
        """None when no row computes an image token this step (a chunk before an image, or a
        prefix-cache hit past it)."""
        wanted = self._wanted(out)
        if not wanted:
            self._drop_done(out)
            return None
        self._encode([key for key in dict.fromkeys(k for k, _, _ in wanted) if key not in self.encoded])
        rows, parts, spans = [], [], [[] for _ in out.request_ids]
        for key, row_index, (base, lo, hi) in wanted:
            image = self.images[key[0]][key[1]]
            rows.extend(range(base + lo - out.num_computed_tokens[row_index],
                              base + hi - out.num_computed_tokens[row_index]))
            parts.append(self.encoded[key][lo - image.offset: hi - image.offset])
            spans[row_index].append((image.offset, image.offset + image.length))
        self._drop_done(out)
        rows_t = torch.tensor(rows, dtype=torch.long, device=self.device)
        return StepImages(rows_t, torch.cat(parts).to(self.dtype), spans)

    def _wanted(self, out: SchedulerOutput) -> list[tuple[tuple[str, int], int, tuple[int, int, int]]]:
        """(request, image) keys with (the row's flat base, the first and end positions computed)."""
        wanted, base = [], 0
        for i, (rid, start, n) in enumerate(zip(out.request_ids, out.num_computed_tokens, out.num_scheduled_tokens)):
            for j, image in enumerate(self.images.get(rid, ())):
                lo, hi = max(start, image.offset), min(start + n, image.offset + image.length)
                if lo < hi:
                    wanted.append(((rid, j), i, (base, lo, hi)))
            base += n
        return wanted

    def _encode(self, keys: list[tuple[str, int]]) -> None:
        if not keys:
            return
        by_shape: dict[tuple[int, ...], list[tuple[str, int]]] = {}
        for rid, j in keys:  # one batch per size (Qwen2.5-VL's images keep their own)
            by_shape.setdefault(tuple(self.images[rid][j].shape), []).append((rid, j))
        for group in by_shape.values():
            pixels = np.stack([_pixels(self.images[rid][j]) for rid, j in group])
            batch = torch.from_numpy(pixels).to(self.device)
            embeddings = self.model.encode_images(batch.to(self.dtype))
            self.encoder_calls += len(group)
            for key, emb in zip(group, embeddings):
                self.encoded[key] = emb

    def _drop_done(self, out: SchedulerOutput) -> None:
        """Forget the images whose every token this step computes (a preempted request that
        recomputes them is sent as new, and encodes again)."""
        for rid, start, n in zip(out.request_ids, out.num_computed_tokens, out.num_scheduled_tokens):
            images = self.images.get(rid)
            if images is None:
                continue
            for j, image in enumerate(images):
                if start + n >= image.offset + image.length:
                    self.encoded.pop((rid, j), None)
            if all(start + n >= im.offset + im.length for im in images):
                del self.images[rid]

    def _forget(self, rid: str) -> None:
        images = self.images.pop(rid, None)
        for j in range(len(images or ())):
            self.encoded.pop((rid, j), None)


def _pixels(image: ImageInput) -> np.ndarray:
    return np.frombuffer(image.pixels, dtype=np.float32).reshape(image.shape)
