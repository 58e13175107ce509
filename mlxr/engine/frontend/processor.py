"""The frontend's intake: prompt to token ids, and refusal of what can never run."""
from __future__ import annotations

from dataclasses import dataclass

from mlxr.engine.structured.grammar import check as check_structured
from mlxr.errors import ContextLengthError, InvalidParameterError
from mlxr.types import SamplingParams

_INT_TYPES = {int, bool}


def _plain_ids_below(ids: list[int], vocab: int) -> bool:
    """The common case checked in C (a Python test per id cost 6% of the serving thread):
    plain ints in [0, vocab). False sends the caller to the exact per-id test."""
    return bool(ids) and set(map(type, ids)) <= _INT_TYPES and min(ids) >= 0 and max(ids) < vocab


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_model_len: int


class Processor:
    def __init__(self, tokenizer, limits: Limits) -> None:
        self.tokenizer = tokenizer
        self.limits = limits

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        vocab = self.limits.vocab_size
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt), prompt
            if ids and max(ids) >= vocab:  # a tokenizer with added tokens past the embedding
                raise InvalidParameterError("prompt", f"the text encodes to token ids past the model's vocabulary of {vocab}")
        else:
            ids, text = list(prompt), None
            if not _plain_ids_below(ids, vocab) and any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise InvalidParameterError("prompt", f"token ids must be integers in [0, {vocab})")
        if not ids:
            raise InvalidParameterError("prompt", "the prompt is empty")
        return text, ids

    def check_ids(self, ids: list[int]) -> None:
        """Ids the tokenizer made from a prompt with images: inside the vocabulary."""
        if ids and max(ids) >= self.limits.vocab_size:
            raise InvalidParameterError("prompt", f"the text encodes to token ids past the model's vocabulary "
                                                  f"of {self.limits.vocab_size}")

    def max_tokens(self, ids: list[int], params: SamplingParams) -> int:
        """Refuse what can never run; returns the effective max_tokens. Without max_tokens
        a request may fill the context; with it, prompt + max_tokens must fit (as vLLM)."""
        vocab = self.limits.vocab_size
        if params.structured_outputs is not None:
            check_structured(params.structured_outputs)  # a cache hit when AsyncEngine checked it
        for name, tokens in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids)):
            if any(t >= vocab for t in tokens):
                raise InvalidParameterError(name, f"token ids must be below the vocabulary size {vocab}")
        limit = self.limits.max_model_len
        if len(ids) >= limit:
            raise ContextLengthError(len(ids), limit)
        if params.max_tokens is not None and len(ids) + params.max_tokens > limit:
            raise ContextLengthError(len(ids), limit, params.max_tokens)
        return params.max_tokens or limit - len(ids)
