"""Hidden states of a padded batch -> one vector per input, as llama.cpp's `--pooling` names
them (mean, cls, last); then L2 normalisation and Matryoshka truncation where asked."""
from __future__ import annotations

import torch

POOLING_MODES = ("mean", "cls", "last")


def pool(hidden: torch.Tensor, lengths: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [B, T, H] (rows past each length are padding), lengths [B] -> [B, H] float32."""
    hidden = hidden.float()
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
    if mode == "mean":
        real = (torch.arange(hidden.shape[1], device=hidden.device)[None] < lengths[:, None]).float()
        return (hidden * real[..., None]).sum(1) / lengths[:, None].float()
    raise ValueError(f"pooling {mode!r} is not one of {POOLING_MODES}")


def finish(vectors: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """Keep the first `dimensions` values (Matryoshka), then L2-normalise if asked: a
    truncated normalised vector is normalised again."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    return torch.nn.functional.normalize(vectors, dim=-1) if normalize else vectors


class PooledHead(torch.nn.Module):
    """sentence-transformers Dense modules after the pooling (EmbeddingGemma's two): each a
    linear layer, then identity or tanh. Parameters `pooled_head.{j}.weight` / `.bias`."""

    def __init__(self, layers: list[tuple[int, int, bool, str]]) -> None:
        super().__init__()
        self.activations = [a for *_, a in layers]
        for j, (i, o, b, _) in enumerate(layers):  # named 0, 1, ... as the loaders give them
            self.register_module(str(j), torch.nn.Linear(i, o, bias=b))

    @property
    def out_features(self) -> int:
        return getattr(self, str(len(self.activations) - 1)).out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for j, act in enumerate(self.activations):
            x = getattr(self, str(j))(x)
            x = torch.tanh(x) if act == "tanh" else x
        return x
