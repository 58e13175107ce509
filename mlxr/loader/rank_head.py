"""Qwen3-Reranker's GGUF: llama.cpp's converter writes `pooling_type` rank and a two-row
`cls.output` (the lm_head's "yes" and "no" rows, in the order of `classifier.output_labels`) and
drops the lm_head itself. MLXR scores a decoder reranker by the yes/no logits of its lm_head
(server/openai/rerank.py), so the head is rebuilt: a tied model's embedding rows already are
those rows; an untied one gets an lm_head of the embedding with the two rows put back (only
their logits are ever read: scores are the softmax over the two)."""
from __future__ import annotations

import numpy as np

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import GGUFFile
from mlxr.formats.gguf_types import to_float32

RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK
_ANSWERS = ("yes", "no")


def is_rank_model(f: GGUFFile) -> bool:
    arch = f.metadata.get("general.architecture")
    return f.metadata.get(f"{arch}.pooling_type") == RANK_POOLING and "cls.output.weight" in f


def answer_rows(f: GGUFFile, token_id) -> dict[int, np.ndarray]:
    """{token id: its cls.output row} for the yes/no labels."""
    arch = f.metadata.get("general.architecture")
    labels = f.metadata.get(f"{arch}.classifier.output_labels")
    if not isinstance(labels, list) or sorted(labels) != sorted(_ANSWERS):
        raise ModelFormatError(f"a rank GGUF's {arch}.classifier.output_labels must be yes and no, got {labels!r}")
    rows = f.load("cls.output.weight")
    ids = [token_id(label) for label in labels]
    if None in ids or rows.shape[0] != len(labels):
        raise ModelFormatError("a rank GGUF's vocabulary lacks its yes / no labels, or cls.output does not match them")
    return dict(zip(ids, rows))


def untied_head(f: GGUFFile, rows: dict[int, np.ndarray]) -> np.ndarray | None:
    """The lm_head to serve the scores with: None where the embedding's rows are the answers'
    (a tied checkpoint), else the embedding with the answer rows replaced."""
    raw, kind = f.load_raw("token_embd.weight")
    width = f.tensor_info("token_embd.weight").shape[1]
    # the two rows alone first: a tied checkpoint needs no dequantized embedding
    if all(np.array_equal(to_float32("token_embd.weight", raw[i:i + 1], kind, (1, width))[0], row)
           for i, row in rows.items()):
        return None
    embedding = f.load("token_embd.weight")
    for i, row in rows.items():
        embedding[i] = row
    return embedding
