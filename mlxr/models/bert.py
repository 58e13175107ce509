"""BERT encoders (bge, e5, gte, MiniLM cross-encoders): learned positions, token types,
post-norm blocks, bidirectional attention over a padded batch. No KV cache: an encoder runs
one forward per batch of whole inputs (mlxr/engine/encoder/).

Parameter names are the HF checkpoint's with the `bert.` / `roberta.` prefix dropped; a
sequence-classification head is `classifier.dense` (tanh) then `classifier.out_proj`, which is
RoBERTa's head and also BERT's pooler + classifier (renamed at load, as llama.cpp does).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.errors import UnsupportedModelError
from mlxr.formats.hf_config import positive_float, positive_int
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture

# HF config hidden_act -> ours; "gelu" is the exact (erf) GELU.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_pytorch_tanh", "gelu_pytorch_tanh": "gelu_pytorch_tanh",
               "relu": "relu", "silu": "silu", "swish": "silu"}
# GGUF `<arch>.pooling_type` (llama.cpp's enum) -> our pooling names.
GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def activation_fn(name: str):
    if name == "gelu":
        return nn.functional.gelu
    if name == "gelu_pytorch_tanh":
        return lambda x: nn.functional.gelu(x, approximate="tanh")
    if name == "relu":
        return nn.functional.relu
    return nn.functional.silu


class BertEmbeddings(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        e = args.extra
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(e.get("type_vocab_size", 2), args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.rms_norm_eps)

    def forward(self, ids: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.position_embeddings(positions)[None] + self.token_type_embeddings(types)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h = args.hidden_size
        self.heads = args.num_attention_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.query, self.key, self.value))
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, t, h)


class DenseNorm(nn.Module):
    """dense, then LayerNorm over (that + the residual): BERT's post-norm output."""

    def __init__(self, n_in: int, args: ModelArgs) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.self = BertSelfAttention(args)
        self.output = DenseNorm(args.hidden_size, args)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.intermediate_size)
        self.act = activation_fn(args.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention = BertAttention(args)
        self.intermediate = Intermediate(args)
        self.output = DenseNorm(args.intermediate_size, args)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(args) for _ in range(args.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class ClassificationHead(nn.Module):
    """First token -> tanh(dense) -> out_proj: relevance logits of a cross-encoder. `dense` is
    absent where the file has none (llama.cpp's converter drops BERT's pooler)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h, labels = args.hidden_size, args.extra["num_labels"]
        self.dense = nn.Linear(h, h) if args.extra.get("classifier_dense", True) else None
        self.out_proj = nn.Linear(h, labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            first = torch.tanh(self.dense(first))
        return self.out_proj(first)


class BertModel(nn.Module):
    """ids, token types, lengths [B] -> last hidden states [B, T, H] (padding rows are junk)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embeddings = BertEmbeddings(args)
        self.encoder = BertEncoder(args)
        self.classifier = ClassificationHead(args) if args.extra.get("num_labels") else None

    def forward(self, ids: torch.Tensor, types: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embeddings(ids, types), padding_mask(lengths, ids.shape[1]))


def padding_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """[B, 1, 1, T] True where a key is a real token: every token attends to all of its row's."""
    return (torch.arange(width, device=lengths.device)[None] < lengths[:, None])[:, None, None]


# --- the declaration ----------------------------------------------------------------------
_DROPPED = ("hidden_act", "hidden_activation", "num_key_value_heads", "sliding_window", "rope_scaling",
            "rope_parameters", "head_dim", "mlp_bias", "tie_word_embeddings")


def encoder_hf_config(config: dict) -> dict:
    """config.json as the shared reader takes it: the encoder-only keys stay aside (`_raw`)."""
    cfg = {k: v for k, v in config.items() if k not in _DROPPED}
    cfg["_raw"] = config
    return cfg


def num_labels(config: dict) -> int:
    """A sequence-classification checkpoint's label count, else 0 (an embedding model)."""
    arches = config.get("architectures") or []
    if not any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in arches):
        return 0
    labels = config.get("id2label")
    return config.get("num_labels") or (len(labels) if isinstance(labels, dict) else 2)


def bert_hf_fields(cfg: dict) -> dict[str, Any]:
    raw = cfg["_raw"]
    act = raw.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise UnsupportedModelError(f"position_embedding_type {raw['position_embedding_type']!r} is not supported")
    offset = position_offset(raw)
    return {"hidden_act": ACTIVATIONS[act], "rms_norm_eps": positive_float(cfg, "layer_norm_eps", 1e-12),
            "max_position_embeddings": positive_int(cfg, "max_position_embeddings", 512) - offset,
            "tie_word_embeddings": False,
            "extra": {"hf_model_type": raw.get("model_type"), "encoder": True, "position_offset": offset,
                      "type_vocab_size": positive_int(cfg, "type_vocab_size", 2), "num_labels": num_labels(raw),
                      "classifier_dense": True, "pad_token_id": raw.get("pad_token_id")}}


def position_offset(raw: dict) -> int:
    """RoBERTa's positions start past the padding id: those first rows are never used, and
    dropped at load (llama.cpp's converter drops them too)."""
    if raw.get("model_type") in ("xlm-roberta", "roberta", "camembert") and raw.get("pad_token_id") is not None:
        return int(raw["pad_token_id"]) + 1
    return 0


def bert_gguf_fields(m: Any) -> dict[str, Any]:
    pooling = m.raw("pooling_type")
    types = m.metadata.get("tokenizer.ggml.token_type_count", 2)
    return {"hidden_act": "gelu", "rms_norm_eps": m.pos_float("attention.layer_norm_epsilon", 1e-12),
            "tie_word_embeddings": False,
            "extra": {"gguf_architecture": m.arch, "encoder": True, "position_offset": 0,
                      "type_vocab_size": max(int(types), 1), "num_labels": _gguf_labels(m),
                      "pooling": GGUF_POOLING.get(pooling) if pooling is not None else None,
                      "classifier_dense": True}}


def _gguf_labels(m: Any) -> int:
    """A reranker's label count: its classification output's rows (llama.cpp's converter writes
    output_labels for embedding models too)."""
    out = m.tensor("cls.output.bias")
    return int(out.shape[0]) if out is not None else 0


# GGUF tensor -> our parameter name ("{i}": the layer).
GGUF_TENSORS = {
    "token_embd": "embeddings.word_embeddings", "position_embd": "embeddings.position_embeddings",
    "token_types": "embeddings.token_type_embeddings", "token_embd_norm": "embeddings.LayerNorm",
    "blk.{i}.attn_q": "encoder.layer.{i}.attention.self.query",
    "blk.{i}.attn_k": "encoder.layer.{i}.attention.self.key",
    "blk.{i}.attn_v": "encoder.layer.{i}.attention.self.value",
    "blk.{i}.attn_output": "encoder.layer.{i}.attention.output.dense",
    "blk.{i}.attn_output_norm": "encoder.layer.{i}.attention.output.LayerNorm",
    "blk.{i}.ffn_up": "encoder.layer.{i}.intermediate.dense",
    "blk.{i}.ffn_down": "encoder.layer.{i}.output.dense",
    "blk.{i}.layer_output_norm": "encoder.layer.{i}.output.LayerNorm",
    "cls": "classifier.dense", "cls.output": "classifier.out_proj",
}
# HF checkpoint names (prefix dropped) -> ours, where they differ.
HF_RENAMES = {"pooler.dense.": "classifier.dense.", "classifier.weight": "classifier.out_proj.weight",
              "classifier.bias": "classifier.out_proj.bias"}
HF_PREFIXES = ("bert.", "roberta.", "model.")

MODEL = BertModel
ARCH = Architecture("bert", ("bert",), ("bert",), hf_config=encoder_hf_config, hf_fields=bert_hf_fields,
                    hf_max_positions=512, gguf_fields=bert_gguf_fields)
