"""Train a draft head to copy a tiny target, on the CPU in seconds: the target (Hugging Face
transformers, fp32) writes greedy continuations of random prompts; the head learns, from each
position's target features and the next token, the target's greedy token after that (one
draft step, teacher-forced: what the first draft needs). The head's math here is plain torch
over whole sequences (causal attention, RoPE as Llama's), the same as mlxr's paged forward of
the head; the trained weights are written in the head's checkpoint layout."""
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


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, T, heads, d] rotated by position (Llama's half-split rotation)."""
    d, t = x.shape[-1], x.shape[1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(t, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos()[None, :, None], torch.cat([ang, ang], -1).sin()[None, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _attention(x: torch.Tensor, w: dict, p: str, c: dict) -> torch.Tensor:
    b, t = x.shape[:2]
    nh, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = _rope((x @ w[p + "q_proj.weight"].T).view(b, t, nh, hd), c["rope_theta"]).transpose(1, 2)
    k = _rope((x @ w[p + "k_proj.weight"].T).view(b, t, kv, hd), c["rope_theta"]).transpose(1, 2)
    v = (x @ w[p + "v_proj.weight"].T).view(b, t, kv, hd).transpose(1, 2)
    k, v = k.repeat_interleave(nh // kv, 1), v.repeat_interleave(nh // kv, 1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, nh * hd)
    return o @ w[p + "o_proj.weight"].T


def _mlp(x: torch.Tensor, w: dict, p: str) -> torch.Tensor:
    return (F.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def eagle3_logits(w: dict, c: dict, embeds: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    eps, m = c["rms_norm_eps"], "midlayer."
    hidden = feats @ w["fc.weight"].T
    x = torch.cat([_rms(embeds, w[m + "input_layernorm.weight"], eps), _rms(hidden, w[m + "hidden_norm.weight"], eps)], -1)
    s = _attention(x, w, m + "self_attn.", c) + hidden
    out = _mlp(_rms(s, w[m + "post_attention_layernorm.weight"], eps), w, m + "mlp.") + s
    return _rms(out, w["norm.weight"], eps) @ w["lm_head.weight"].T


def mtp_logits(w: dict, c: dict, embeds: torch.Tensor, feats: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    eps, b = c["rms_norm_eps"], "mtp.layers.0."
    x = torch.cat([_rms(embeds, w["mtp.pre_fc_norm_embedding.weight"], eps),
                   _rms(feats, w["mtp.pre_fc_norm_hidden.weight"], eps)], -1) @ w["mtp.fc.weight"].T
    s = _attention(_rms(x, w[b + "input_layernorm.weight"], eps), w, b + "self_attn.", c) + x
    out = _mlp(_rms(s, w[b + "post_attention_layernorm.weight"], eps), w, b + "mlp.") + s
    return _rms(out, w["mtp.norm.weight"], eps) @ lm_head.T


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

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        """(the head's logits, the target's greedy tokens they should name) of a fresh batch."""
        ids, hs, greedy = target_batch(model, g, sequences, length)
        embeds = model.get_input_embeddings()(ids[:, 1:]).detach()  # head position i takes token i + 1
        if kind == "eagle3":
            feats = torch.cat([hs[i] for i in c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]], -1)[:, :-1]
            return eagle3_logits(w, c, embeds, feats), greedy[:, 1:]
        return mtp_logits(w, c, embeds, hs[-1][:, :-1], lm_head), greedy[:, 1:]  # and names the token after

    for step in range(steps):
        logits, want = batch()
        loss = F.cross_entropy(logits.flatten(0, 1), want.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log is not None and step % 50 == 0:
            log(f"{kind} step {step}: loss {loss.item():.3f}")
    with torch.no_grad():
        logits, want = batch()
        agreement = float((logits.argmax(-1) == want).float().mean())
    arrays = {n: t.detach().numpy().astype(np.float32) for n, t in w.items()}
    if kind == "eagle3":
        return write_eagle3_head(target_dir, Path(out_dir), weights=arrays, config=c), agreement
    return write_mtp_target(target_dir, Path(out_dir), weights=arrays), agreement
