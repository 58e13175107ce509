"""An EAGLE-3 draft head in its published layout (the EAGLE repository's and SpecForge's):
fc fuses three of the target's residual streams (low, middle, high layers: 3 x target hidden)
into one hidden; one llama decoder layer (`midlayer`) whose attention reads the normed token
embedding and the normed hidden side by side (2 x hidden in); its final norm; an lm_head over a
draft vocabulary, mapped to the target's by d2t (target id = draft id + d2t[draft id]). Each
draft after the first takes the head's own hidden (before the final norm) in fc's place."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from mlxr.engine.spec_decode.head_weights import place_weights, read_tensors
from mlxr.errors import ModelFormatError
from mlxr.formats.json_file import read_json_object
from mlxr.layers.linear import Linear
from mlxr.layers.mlp import ACTIVATIONS, GatedMLP
from mlxr.layers.norm import RMSNorm
from mlxr.model_config import ModelArgs
from mlxr.models.llama import LlamaAttention

MAX_HEAD_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Eagle3Config:
    args: ModelArgs  # the head's own layer (hidden_size, heads, intermediate_size, rope); vocab: the target's
    draft_vocab_size: int
    target_hidden_size: int
    aux_layers: tuple[int, ...]


def read_eagle3_config(head_dir: Path, target: ModelArgs) -> Eagle3Config:
    """The head's config.json, checked against the target it drafts for."""
    c = read_json_object(head_dir / "config.json", MAX_HEAD_CONFIG_BYTES)

    def whole(key: str, default: int | None = None) -> int:
        v = c.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelFormatError(f"EAGLE-3 head config.json: {key} must be a positive integer, not {v!r}")
        return v

    hidden, heads = whole("hidden_size"), whole("num_attention_heads")
    vocab = whole("vocab_size", target.vocab_size)
    if vocab != target.vocab_size:
        raise ModelFormatError(f"EAGLE-3 head: its vocabulary has {vocab} tokens, the target's {target.vocab_size}")
    target_hidden = whole("target_hidden_size", hidden)
    if target_hidden != target.hidden_size:
        raise ModelFormatError(f"EAGLE-3 head: made for a target of hidden size {target_hidden}, "
                               f"this target's is {target.hidden_size}")
    draft_vocab = whole("draft_vocab_size", vocab)
    if draft_vocab > vocab:
        raise ModelFormatError(f"EAGLE-3 head: draft_vocab_size {draft_vocab} exceeds the vocabulary ({vocab})")
    layers = target.num_hidden_layers
    aux = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or (2, layers // 2, layers - 3)
    if len(aux) != 3 or any(not isinstance(i, int) or not 0 <= i < layers for i in aux):
        raise ModelFormatError(f"EAGLE-3 head: aux hidden state layers {list(aux)} are not three layers of the "
                               f"target's {layers}")
    act = c.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ModelFormatError(f"EAGLE-3 head config.json: hidden_act {act!r} is not one of {sorted(ACTIVATIONS)}")
    eps = c.get("rms_norm_eps", target.rms_norm_eps)
    theta = c.get("rope_theta", target.rope_theta)
    args = replace(target, hidden_size=hidden, intermediate_size=whole("intermediate_size"), num_hidden_layers=1,
                   num_attention_heads=heads, num_key_value_heads=whole("num_key_value_heads", heads),
                   head_dim=whole("head_dim", hidden // heads), rms_norm_eps=float(eps), rope_theta=float(theta),
                   rope_scaling=target.rope_scaling if c.get("rope_scaling") else None, attention_bias=False,
                   sliding_window=None, sliding_layers=(), hidden_act=act)
    return Eagle3Config(args, draft_vocab, target_hidden, tuple(aux))


class Eagle3Layer(nn.Module):
    """The midlayer: a llama decoder layer whose attention takes cat(norm(embed), norm(hidden))."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h = args.hidden_size
        self.self_attn = LlamaAttention(replace(args, hidden_size=2 * h), 0)
        self.self_attn.o_proj = Linear(args.num_attention_heads * args.head_dim, h, bias=False)
        self.mlp = GatedMLP(h, args.intermediate_size, args.hidden_act)
        self.input_layernorm = RMSNorm(h, args.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, args.rms_norm_eps)

    def forward(self, embeds, hidden, positions, kv, meta) -> torch.Tensor:
        """The layer's output with its residual added (the stream before the final norm)."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn = self.self_attn(x, positions, kv, meta)
        normed, residual = self.post_attention_layernorm(attn, hidden)
        return self.mlp(normed) + residual


class Eagle3Head(nn.Module):
    """What HeadProposer drives: features of the target's tokens in, draft logits out."""

    identity_map = True  # every draft id is its own target id (no d2t, or an identity one)

    def __init__(self, config: Eagle3Config, own_embedding: bool) -> None:
        super().__init__()
        a = config.args
        self.config, self.aux_layers, self.kv_args = config, config.aux_layers, a
        self.fc = Linear(3 * config.target_hidden_size, a.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(a)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = Linear(a.hidden_size, config.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size) if own_embedding else None
        self.register_buffer("targets", torch.arange(config.draft_vocab_size), persistent=False)
        self.target_embed = None  # the target's embed(), when the head has no table of its own

    def features(self, final: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        """What the head keeps of each target token: its three streams side by side."""
        return torch.cat(aux, dim=-1)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)

    def forward(self, input_ids, hidden, positions, kv, meta) -> tuple[torch.Tensor, torch.Tensor]:
        """(the normed rows the lm_head reads, the rows the next draft takes as its hidden)."""
        embeds = self.target_embed(input_ids) if self.embed_tokens is None else self.embed_tokens(input_ids)
        out = self.midlayer(embeds.to(hidden.dtype), hidden, positions, kv, meta)
        return self.norm(out), out

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits over the target's vocabulary: the draft vocabulary's at their target ids,
        -inf elsewhere (a token the head cannot name is never drafted)."""
        small = self.lm_head(normed).float()
        if small.shape[-1] == self.config.args.vocab_size and self.identity_map:
            return small
        full = small.new_full((small.shape[0], self.config.args.vocab_size), float("-inf"))
        return full.index_copy_(1, self.targets, small)


def load_eagle3(head_dir: str | Path, target_model: nn.Module, target: ModelArgs, dtype: torch.dtype,
                device: torch.device) -> Eagle3Head:
    head_dir = Path(head_dir)
    if not (head_dir / "config.json").is_file():
        raise ModelFormatError(f"EAGLE-3 head: {head_dir} has no config.json")
    config = read_eagle3_config(head_dir, target)
    tensors = read_tensors(head_dir)
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    own_embedding = "embed_tokens.weight" in tensors
    if not own_embedding and config.args.hidden_size != target.hidden_size:
        raise ModelFormatError("EAGLE-3 head: no embed_tokens.weight of its own, and its hidden size "
                               f"{config.args.hidden_size} is not the target's {target.hidden_size}")
    with torch.device("meta"):
        head = Eagle3Head(config, own_embedding)
    place_weights(head, tensors, f"EAGLE-3 head {head_dir.name}", dtype, device)
    head.targets = _draft_targets(d2t, t2d, config, device)
    head.identity_map = bool(torch.equal(head.targets, torch.arange(config.draft_vocab_size, device=device)))
    if not own_embedding:
        head.target_embed = target_model.model.embed
    return head


def _draft_targets(d2t, t2d, config: Eagle3Config, device: torch.device) -> torch.Tensor:
    """Each draft id's target id, from d2t offsets (checked: distinct ids inside the vocabulary)."""
    n, vocab = config.draft_vocab_size, config.args.vocab_size
    if d2t is None:
        if n != vocab:
            raise ModelFormatError(f"EAGLE-3 head: a draft vocabulary of {n} tokens needs a d2t mapping")
        return torch.arange(n, device=device)
    if tuple(d2t.shape) != (n,) or d2t.dtype.is_floating_point:
        raise ModelFormatError(f"EAGLE-3 head: d2t must be {n} integers, not {tuple(d2t.shape)} {d2t.dtype}")
    targets = torch.arange(n) + d2t.long()
    if int(targets.min()) < 0 or int(targets.max()) >= vocab or targets.unique().numel() != n:
        raise ModelFormatError("EAGLE-3 head: d2t maps draft tokens outside the vocabulary, or two onto one")
    if t2d is not None and (t2d.numel() != vocab or int(t2d.bool().sum()) != n
                            or not bool(t2d.bool()[targets].all())):
        raise ModelFormatError("EAGLE-3 head: t2d does not mark the tokens d2t maps to")
    return targets.to(device)
