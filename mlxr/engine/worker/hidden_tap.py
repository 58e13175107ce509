"""The target's hidden states of each step's tokens, for a proposer that drafts from them
(spec_decode/heads.py): the final hidden states the model returns, and the residual streams
entering the layers the proposer names (forward pre-hooks on those blocks, active only while
a tapped forward runs). A runner without a tap registers nothing and pays nothing."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.engine.records import SchedulerOutput
from mlxr.engine.spec_decode.proposer import StepHidden


class HiddenTap:
    def __init__(self, model: nn.Module, proposer) -> None:
        """proposer: a HiddenStateProposer (its aux_layers and take_hidden)."""
        self.proposer, self.layers = proposer, tuple(proposer.aux_layers)
        self._streams: dict[int, torch.Tensor] = {}
        self._active = False
        blocks = model.model.layers if self.layers else []
        self._hooks = [blocks[i].register_forward_pre_hook(self._grab(i)) for i in sorted(set(self.layers))]

    def _grab(self, layer: int):
        def hook(module, args):
            if self._active:  # args: (x, positions, kv_cache, meta, residual): the stream is x + residual
                x, residual = args[0], args[4] if len(args) > 4 else None
                self._streams[layer] = x if residual is None else x + residual
        return hook

    def forward(self, model: nn.Module, input_ids, positions, kv_layers, meta, embeds=None) -> torch.Tensor:
        """The model's forward, its streams caught on the way."""
        self._streams, self._active = {}, True
        try:
            return model(input_ids, positions, kv_layers, meta) if embeds is None else \
                model(input_ids, positions, kv_layers, meta, embeds)
        finally:
            self._active = False

    def hand_over(self, out: SchedulerOutput, hidden: torch.Tensor) -> None:
        """The step's rows are out's, in order, each num_scheduled_tokens tokens long (a
        speculative row's drafts included)."""
        aux = [self._streams[i] for i in self.layers]
        self._streams = {}
        self.proposer.take_hidden(StepHidden(list(out.request_ids), list(out.num_computed_tokens),
                                             list(out.num_scheduled_tokens), hidden, aux))

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
