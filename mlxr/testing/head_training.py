"""Train a draft head to copy a tiny target, on the CPU in seconds: each step, fresh random
token sequences through the target (Hugging Face transformers, fp32) give its features and its
greedy next tokens; the head learns, from position i's features and token i + 1, the target's
token after i + 1 (its first draft), and from its own output and token i + 2 the one after
that (its second draft, attending as inference does: EAGLE-3's training-time test). The head's
math here is plain torch over whole sequences (masked attention, RoPE as Llama's), the same as
mlxr's paged forward of the head; the weights are written in the head's checkpoint layout."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mlxr.testing.head_fixtures import (eagle3_config, eagle3_shapes, mtp_shapes, random_weights,
                                        write_eagle3_head, write_mtp_target)


def target_model(target_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()


def target_batch(model, g: torch.Generator, sequences: int, length: int):
    """Random token sequences (fresh each step: the head learns the target's map, not a few
    sequences), the target's hidden states (hidden_states[i]: layer i's input; the last, after
    the final norm) and its greedy next token at each position."""
    ids = torch.randint(3, model.config.vocab_size, (sequences, length), generator=g)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    return ids, out.hidden_states, out.logits.argmax(-1)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, theta: float, offset: int) -> torch.Tensor:
    """x [B, T, heads, d] rotated by positions offset, offset + 1, ... (Llama's half-split rotation)."""
    d, t = x.shape[-1], x.shape[1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(offset, offset + t, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos()[None, :, None], torch.cat([ang, ang], -1).sin()[None, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _mlp(x: torch.Tensor, w: dict, p: str) -> torch.Tensor:
    return (F.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


# Each head's layer: where its weights are, and its norms' names.
LAYOUT = {"eagle3": {"layer": "midlayer.", "norm": "norm.weight"},
          "mtp": {"layer": "mtp.layers.0.", "norm": "mtp.norm.weight"}}


def _layer_input(kind: str, w: dict, c: dict, embeds: torch.Tensor, hidden: torch.Tensor):
    """(what the attention projects, the residual stream it adds to)."""
    eps = c["rms_norm_eps"]
    if kind == "eagle3":
        m = LAYOUT[kind]["layer"]
        return torch.cat([_rms(embeds, w[m + "input_layernorm.weight"], eps),
                          _rms(hidden, w[m + "hidden_norm.weight"], eps)], -1), hidden
    x = torch.cat([_rms(embeds, w["mtp.pre_fc_norm_embedding.weight"], eps),
                   _rms(hidden, w["mtp.pre_fc_norm_hidden.weight"], eps)], -1) @ w["mtp.fc.weight"].T
    return _rms(x, w[LAYOUT[kind]["layer"] + "input_layernorm.weight"], eps), x


def _qkv(x: torch.Tensor, w: dict, p: str, c: dict, offset: int):
    b, t = x.shape[:2]
    nh, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = _rope((x @ w[p + "q_proj.weight"].T).view(b, t, nh, hd), c["rope_theta"], offset).transpose(1, 2)
    k = _rope((x @ w[p + "k_proj.weight"].T).view(b, t, kv, hd), c["rope_theta"], offset).transpose(1, 2)
    v = (x @ w[p + "v_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
    return q, k.repeat_interleave(nh // kv, 1), v.repeat_interleave(nh // kv, 1)


def head_steps(kind: str, w: dict, c: dict, embeds: torch.Tensor, hidden: torch.Tensor, lm_head: torch.Tensor,
               next_embeds: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Logits of the head's first draft at every position (embeds: tokens i + 1; hidden: the
    target's features of token i, through fc for EAGLE-3) and, given next_embeds (tokens i + 2),
    of its second draft, as inference runs it: from the first's own output, attending the first
    step's entries up to its position and its own (EAGLE-3's training-time test)."""
    m, eps = LAYOUT[kind]["layer"], c["rms_norm_eps"]
    p = m + "self_attn."
    hidden = hidden @ w["fc.weight"].T if kind == "eagle3" else hidden
    x, residual = _layer_input(kind, w, c, embeds, hidden)
    q, k, v = _qkv(x, w, p, c, 0)
    b, t = x.shape[:2]

    def finish(o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = o.transpose(1, 2).reshape(b, o.shape[2], -1) @ w[p + "o_proj.weight"].T + residual
        out = _mlp(_rms(s, w[m + "post_attention_layernorm.weight"], eps), w, m + "mlp.") + s
        normed = _rms(out, w[LAYOUT[kind]["norm"]], eps)
        head = w["lm_head.weight"] if kind == "eagle3" else lm_head
        return normed @ head.T, (out if kind == "eagle3" else normed)

    logits, chain = finish(F.scaled_dot_product_attention(q, k, v, is_causal=True), residual)
    if next_embeds is None:
        return [logits]
    x2, residual2 = _layer_input(kind, w, c, next_embeds, chain[:, :-1])
    q2, k2, v2 = _qkv(x2, w, p, c, 1)
    t2 = t - 1
    mask = torch.cat([torch.ones(t2, t, dtype=torch.bool).tril(), torch.eye(t2, dtype=torch.bool)], 1)
    o2 = F.scaled_dot_product_attention(q2, torch.cat([k, k2], 2), torch.cat([v, v2], 2), attn_mask=mask)
    return [logits, finish(o2, residual2)[0]]


def train_head(kind: str, target_dir: Path, out_dir: Path, steps: int = 300, lr: float = 3e-3,
               seed: int = 0, sequences: int = 32, length: int = 32, log=None) -> tuple[Path, float]:
    """Train an "eagle3" head or an "mtp" layer for target_dir and write it to out_dir (the
    head's directory, or the target's copy with its mtp.* tensors); returns (that directory,
    the head's agreement with the target's greedy token on sequences it never saw)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only contend (2 s a step on a loaded host, 0.07 s on one)
    try:
        return _train(kind, Path(target_dir), Path(out_dir), steps, lr, seed, sequences, length, log)
    finally:
        torch.set_num_threads(threads)


def _train(kind, target_dir, out_dir, steps, lr, seed, sequences, length, log) -> tuple[Path, float]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    c = json.loads((target_dir / "config.json").read_text())
    model = target_model(target_dir)
    if kind == "eagle3":
        c = eagle3_config(c, c["vocab_size"])
        shapes = eagle3_shapes(c)
    else:
        shapes = mtp_shapes(c)
    lm_head = model.get_output_embeddings().weight.detach()
    w = {n: torch.tensor(a, requires_grad=True) for n, a in random_weights(shapes, seed, std=0.05).items()}
    opt = torch.optim.Adam(w.values(), lr=lr)

    def batch() -> tuple[list[torch.Tensor], torch.Tensor]:
        """(the head's first and second drafts' logits, the target's greedy tokens) of a fresh batch."""
        ids, hs, greedy = target_batch(model, g, sequences, length)
        embeds = model.get_input_embeddings()(ids).detach()  # head position i takes token i + 1
        if kind == "eagle3":
            feats = torch.cat([hs[i] for i in c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]], -1)[:, :-1]
        else:
            feats = hs[-1][:, :-1]  # after the final norm
        return head_steps(kind, w, c, embeds[:, 1:], feats, lm_head, embeds[:, 2:]), greedy

    for step in range(steps):
        (first, second), greedy = batch()  # the first names the target's token after i + 1, the second after i + 2
        loss = (F.cross_entropy(first.flatten(0, 1), greedy[:, 1:].flatten())
                + F.cross_entropy(second.flatten(0, 1), greedy[:, 2:].flatten()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log is not None and step % 50 == 0:
            log(f"{kind} step {step}: loss {loss.item():.3f}")
    with torch.no_grad():
        (first, _), greedy = batch()
        agreement = float((first.argmax(-1) == greedy[:, 1:]).float().mean())
    arrays = {n: t.detach().numpy().astype(np.float32) for n, t in w.items()}
    if kind == "eagle3":
        return write_eagle3_head(target_dir, Path(out_dir), weights=arrays, config=c), agreement
    return write_mtp_target(target_dir, Path(out_dir), weights=arrays), agreement
