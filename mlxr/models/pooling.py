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
