"""The one interface every proposer implements (n-gram lookup, a draft model; an EAGLE-style
head would be a third): given requests whose tokens are all known on the host, draft up to k
tokens each, with the draft's probabilities when it sampled from a distribution."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from mlxr.types import SamplingParams


@dataclass
class DraftRequest:
    """One decode row to draft for: all its tokens (prompt + outputs, the last not yet
    computed by the target) and how many drafts it may take."""

    request_id: str
    token_ids: list[int]
    num_drafts: int
    params: SamplingParams
    num_prompt_tokens: int = 0  # token_ids[:num_prompt_tokens] are the prompt


@dataclass
class Draft:
    """token_ids: the drafts (possibly fewer than asked, or none). probs: [len(token_ids), vocab]
    float32, the distribution each draft was sampled from; None means each draft was certain
    (a one-hot q: n-gram lookup, or a greedy draft)."""

    token_ids: list[int]
    probs: torch.Tensor | None = None


class ProposerUnavailable(RuntimeError):
    """The proposer cannot draft any more (its draft model failed or was unloaded)."""


class Proposer(Protocol):
    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        """One Draft per request, in order. Raises ProposerUnavailable (or any error) when it
        cannot: the speculator then turns speculation off for those requests."""
        ...

    def retain(self, request_ids: set[str]) -> None:
        """Forget every request not in request_ids (finished, aborted, preempted)."""
        ...


@dataclass
class StepHidden:
    """A target step's hidden states, handed to a proposer that drafts from them (a model head):
    the step's rows in order, row i computing counts[i] tokens of request_ids[i] from position
    starts[i]. final: the target's last hidden states [tokens, hidden] (after its final norm);
    aux: the residual streams entering the layers the proposer asked for (its aux_layers), each
    [tokens, hidden]. Positions of drafts the target then rejects are included: the proposer
    keeps only those below each request's last token."""

    request_ids: list[str]
    starts: list[int]
    counts: list[int]
    final: torch.Tensor
    aux: list[torch.Tensor]


class HiddenStateProposer(Proposer, Protocol):
    """A proposer the runner hands every step's hidden states (the runner runs such steps
    eagerly; a runner without one pays nothing)."""

    aux_layers: tuple[int, ...]  # target layers whose input residual stream it needs (may be empty)

    def take_hidden(self, step: StepHidden) -> None:
        ...
