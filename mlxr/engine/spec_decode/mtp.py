"""A model's own multi-token-prediction layer (DeepSeek-V3, Qwen3-Next, Qwen3.5): the next
token's embedding and the target's last hidden state, each normed, side by side through one
projection (eh_proj: 2 x hidden -> hidden), one decoder block of the target's own kind with a
KV cache of its own, a final norm, and the target's lm_head. A second draft takes the layer's
own output in the target hidden state's place (one layer chained k times).

MTPLayer takes any block with the decoder-block call of mlxr's models
(x, positions, kv, meta, residual) -> (out, residual), so a family plugs in its own; load_mtp
reads Qwen3-Next's and Qwen3.5's layout (`mtp.fc`, `mtp.pre_fc_norm_embedding`,
`mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`) from the target's checkpoint, or the
nextn layer of a GGUF from llama.cpp's converter (loader/mtp_weights.py), with the target's block class."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from mlxr.engine.spec_decode.head_weights import place_weights, read_tensors
from mlxr.errors import ModelFormatError
from mlxr.layers.linear import Linear
from mlxr.model_config import ModelArgs

MTP_PREFIX = "mtp."


class MTPLayer(nn.Module):
    def __init__(self, hidden_size: int, block: nn.Module, norm_class, eps: float, chain_normed: bool = True) -> None:
        """chain_normed: the next draft takes the final norm's output (Qwen3-Next) rather than
        the stream before it (DeepSeek-V3)."""
        super().__init__()
        self.pre_fc_norm_embedding = norm_class(hidden_size, eps)
        self.pre_fc_norm_hidden = norm_class(hidden_size, eps)
        self.fc = Linear(2 * hidden_size, hidden_size, bias=False)
        self.layers = nn.ModuleList([block])
        self.norm = norm_class(hidden_size, eps)
        self.chain_normed = chain_normed

    def forward(self, embeds, hidden, positions, kv, meta) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out, residual = self.layers[0](x, positions, kv, meta, None)
        normed, stream = self.norm(out, residual)
        return normed, normed if self.chain_normed else stream


class MTPHead(nn.Module):
    """What HeadProposer drives: the target's final hidden states in, logits from its lm_head."""

    aux_layers: tuple[int, ...] = ()

    def __init__(self, layer: MTPLayer, target_model: nn.Module, kv_args: ModelArgs) -> None:
        super().__init__()
        self.layer, self.kv_args = layer, kv_args
        self._target = [target_model]  # (a list: the target's weights are not the head's parameters)

    def features(self, final: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
        return final

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def forward(self, input_ids, hidden, positions, kv, meta) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = self._target[0].model.embed(input_ids).to(hidden.dtype)
        return self.layer(embeds, hidden, positions, kv, meta)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self._target[0].compute_logits(normed).float()


def load_mtp(checkpoint: str | Path, target_model: nn.Module, target: ModelArgs, dtype: torch.dtype,
             device: torch.device, make_block=None, read_mtp=None) -> MTPHead:
    """The MTP layer stored beside a target's weights (a directory's `mtp.*` tensors, or a GGUF's
    nextn layer: read_mtp, the loader's loader/mtp_weights.read_mtp_tensors; without it a
    directory's mtp.* tensors as they are), built from the target's own norm class and make_block(args)
    (default: the target's block class, as the layer after its last: a hybrid family's block
    there is full attention)."""
    tensors = (read_mtp or _plain_mtp_tensors)(checkpoint, target)
    backbone = target_model.model
    norm_class = type(backbone.norm)
    with torch.device("meta"):
        block = (make_block or _next_block_class(backbone))(target)
        layer = MTPLayer(target.hidden_size, block, norm_class, target.rms_norm_eps)
    place_weights(layer, tensors, f"the MTP layer of {Path(checkpoint).name}", dtype, device)
    # Its own KV cache: one attention layer (a hybrid target's recurrent layers are not the head's).
    kv_args = replace(target, num_hidden_layers=1, linear_attention=None)
    return MTPHead(layer, target_model, kv_args)


def _plain_mtp_tensors(checkpoint: str | Path, target: ModelArgs) -> dict[str, torch.Tensor]:
    tensors = read_tensors(checkpoint, MTP_PREFIX)
    if not tensors:
        raise ModelFormatError(f"{checkpoint} holds no {MTP_PREFIX}* tensors: the checkpoint has no MTP layer")
    return tensors


def _next_block_class(backbone: nn.Module):
    """The target's block class; a hybrid target's numbered past its layer table (full attention),
    another's as its last layer (whose kind, e.g. sliding or not, the layer table knows)."""
    def make(args: ModelArgs) -> nn.Module:
        index = args.num_hidden_layers if args.linear_attention is not None else args.num_hidden_layers - 1
        return type(backbone.layers[-1])(args, index)
    return make
