"""One encoder forward over padded batches: token ids (and token types, for a pair) -> pooled
vectors, or a cross-encoder's relevance scores."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mlxr.engine.encoder.batches import plan_batches
from mlxr.models.pooling import pool


@dataclass(frozen=True)
class EncoderInput:
    ids: list[int]
    types: list[int] | None = None  # token types of a (query, document) pair; None: all 0


class EncoderRunner:
    def __init__(self, model: nn.Module, device: torch.device, max_batch_tokens: int, max_rows: int = 256) -> None:
        self.model = model
        self.device = device
        self.max_batch_tokens = max_batch_tokens
        self.max_rows = max_rows

    @torch.inference_mode()
    def embed(self, inputs: list[EncoderInput], pooling: str) -> torch.Tensor:
        """[N, H] float32, in the inputs' order (H: the pooled head's width where the model has one)."""
        head = getattr(self.model, "pooled_head", None)

        def reduce(hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            vectors = pool(hidden, lengths, pooling)
            return head(vectors.to(hidden.dtype)).float() if head is not None else vectors

        return self._each_batch(inputs, reduce)

    @torch.inference_mode()
    def classify(self, inputs: list[EncoderInput]) -> torch.Tensor:
        """[N, labels] float32 logits of the classification head on each input's first token."""
        head = self.model.classifier
        return self._each_batch(inputs, lambda hidden, lengths: head(hidden[:, 0]).float())

    def _each_batch(self, inputs: list[EncoderInput], reduce) -> torch.Tensor:
        out: list[torch.Tensor | None] = [None] * len(inputs)
        for batch in plan_batches([len(x.ids) for x in inputs], self.max_batch_tokens, self.max_rows):
            ids, types, lengths = self._padded([inputs[i] for i in batch])
            rows = reduce(self.model(ids, types, lengths), lengths).cpu()
            for j, i in enumerate(batch):
                out[i] = rows[j]
        return torch.stack(out) if out else torch.empty(0)

    def _padded(self, inputs: list[EncoderInput]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = max(len(x.ids) for x in inputs)
        ids = torch.zeros(len(inputs), width, dtype=torch.long)
        types = torch.zeros(len(inputs), width, dtype=torch.long)
        for row, x in enumerate(inputs):
            ids[row, : len(x.ids)] = torch.tensor(x.ids)
            if x.types is not None:
                types[row, : len(x.types)] = torch.tensor(x.types)
        lengths = torch.tensor([len(x.ids) for x in inputs])
        return ids.to(self.device), types.to(self.device), lengths.to(self.device)
