"""Recurrent-state slots beside the paged blocks, for layers whose per-sequence memory is a
fixed-size state rather than K/V (Gated DeltaNet: a causal-convolution state and a delta-rule
matrix state per layer, fp32).

One slot per running request: the scheduler never runs more than max_num_seqs requests, and
there are that many slots, so admission counts them with the running requests. The runner takes
a slot when it learns a request and gives it back when the request finishes, is aborted or is
preempted (a preempted request is recomputed from its first token, which rebuilds its state).
One more slot, the scratch slot, serves one-off prefills outside the scheduler (prompt logprobs,
embeddings)."""
from __future__ import annotations

import torch

from mlxr.model_config import LinearAttentionArgs


def state_bytes(args: LinearAttentionArgs, num_slots: int) -> int:
    return args.state_bytes_per_sequence() * (num_slots + 1)


class RecurrentState:
    def __init__(self, args: LinearAttentionArgs, num_slots: int, device: torch.device) -> None:
        conv_dim = 2 * args.num_key_heads * args.key_head_dim + args.num_value_heads * args.value_head_dim
        slots = num_slots + 1  # the last one is the scratch slot
        self.num_slots, self.scratch = num_slots, num_slots
        self.pools: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            layer: (torch.zeros(slots, conv_dim, args.conv_kernel - 1, dtype=torch.float32, device=device),
                    torch.zeros(slots, args.num_value_heads, args.key_head_dim, args.value_head_dim,
                                dtype=torch.float32, device=device))
            for layer, linear in enumerate(args.layers) if linear
        }
        self.reset()

    @property
    def nbytes(self) -> int:
        return sum(c.numel() * c.element_size() + d.numel() * d.element_size() for c, d in self.pools.values())

    def reset(self) -> None:
        self._free = list(range(self.num_slots - 1, -1, -1))
        self.slot_of: dict[str, int] = {}

    def acquire(self, request_id: str) -> int:
        if request_id in self.slot_of:
            return self.slot_of[request_id]
        if not self._free:
            raise RuntimeError(f"all {self.num_slots} recurrent-state slots are taken "
                               "(the scheduler runs at most max_num_seqs requests)")
        slot = self.slot_of[request_id] = self._free.pop()
        return slot

    def release(self, request_id: str) -> None:
        slot = self.slot_of.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    @property
    def in_use(self) -> int:
        return len(self.slot_of)
