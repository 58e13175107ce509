"""Train Qwen3.5's MTP layer to copy a tiny Qwen3.5 target on the CPU (as head_training.py does
for the llama-block heads): fresh random sequences through the target (transformers fp32) give
its final hidden states and greedy tokens; the layer learns, from position i's hidden state and
token i + 1's embedding, the target's token after i + 1, and, from its own normed output and
token i + 2, the one after that. Its block is transformers' own Qwen3.5 decoder layer (the
full-attention kind, numbered as the target's last full-attention layer), its norms the
target's norm class; the weights are written in the released checkpoints' mtp.* layout
(hybrid_fixtures.write_hybrid_mtp_target). Dense targets only (a MoE block's experts are fused
in transformers' layer, one tensor each in the checkpoint)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlxr.testing.head_training import target_batch, target_model
from mlxr.testing.hybrid_fixtures import write_hybrid_mtp_target


class _MTP(nn.Module):
    """fc over cat(norm(embedding), norm(hidden)), one decoder layer, a final norm (mtp.* names)."""

    def __init__(self, model) -> None:
        super().__init__()
        c, backbone = model.config, model.model
        full = max(i for i, kind in enumerate(c.layer_types) if kind == "full_attention")
        norm, h = type(backbone.norm), c.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden = norm(h, c.rms_norm_eps), norm(h, c.rms_norm_eps)
        self.layers = nn.ModuleList([type(backbone.layers[full])(c, full)])
        self.norm = norm(h, c.rms_norm_eps)
        self._rotary = [backbone.rotary_emb]

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, offset: int) -> torch.Tensor:
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1))
        b, t = x.shape[:2]
        positions = torch.arange(offset, offset + t)[None].expand(b, -1)
        # attention_mask None: the layer's attention is causal over the sequence
        out = self.layers[0](x, position_embeddings=self._rotary[0](x, positions), attention_mask=None,
                             position_ids=positions)
        return self.norm(out)


def train_qwen35_mtp(target_dir: Path, out_dir: Path, steps: int = 300, lr: float = 3e-3, seed: int = 0,
                     sequences: int = 32, length: int = 32, log=None) -> tuple[Path, float]:
    """Train the MTP layer for target_dir and write the target's copy with it to out_dir;
    returns (that directory, the first draft's agreement with the target's greedy token on
    sequences it never saw)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(Path(target_dir), Path(out_dir), steps, lr, seed, sequences, length, log)
    finally:
        torch.set_num_threads(threads)


def _train(target_dir, out_dir, steps, lr, seed, sequences, length, log) -> tuple[Path, float]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = target_model(target_dir)
    if getattr(model.config, "num_experts", 0):
        raise ValueError("train_qwen35_mtp trains a dense Qwen3.5 target's MTP layer only")
    for p in model.parameters():
        p.requires_grad_(False)
    mtp = _MTP(model)
    opt = torch.optim.Adam(mtp.parameters(), lr=lr)
    lm_head = model.get_output_embeddings()

    def batch():
        ids, hs, greedy = target_batch(model, g, sequences, length)
        embeds = model.get_input_embeddings()(ids)
        first = mtp(embeds[:, 1:], hs[-1][:, :-1], 0)  # head position i: token i + 1, features of i
        second = mtp(embeds[:, 2:], first[:, :-1], 1)  # (attending its own step only: close enough to train)
        return lm_head(first), lm_head(second), greedy

    for step in range(steps):
        first, second, greedy = batch()
        loss = (F.cross_entropy(first.flatten(0, 1), greedy[:, 1:].flatten())
                + F.cross_entropy(second.flatten(0, 1), greedy[:, 2:].flatten()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log is not None and step % 50 == 0:
            log(f"qwen35 mtp step {step}: loss {loss.item():.3f}")
    with torch.no_grad():
        first, _, greedy = batch()
        agreement = float((first.argmax(-1) == greedy[:, 1:]).float().mean())
    arrays = {"mtp." + n: t.detach().numpy().astype(np.float32) for n, t in mtp.state_dict().items()}
    return write_hybrid_mtp_target(target_dir, out_dir, weights=arrays), agreement
