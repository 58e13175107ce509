"""An encoder model served: embeddings and relevance scores of whole inputs, computed one call
at a time on a thread that owns the model (the event loop never runs a forward). It answers the
server's engine calls; generation is refused with a 400 that names the embedding routes."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from mlxr.engine.encoder.runner import EncoderInput, EncoderRunner
from mlxr.errors import InvalidParameterError, OverloadedError
from mlxr.model_config import ModelArgs
from mlxr.models.pooling import POOLING_MODES, finish
from mlxr.types import EngineStats, RequestOutput, SamplingParams

log = logging.getLogger(__name__)


class EncoderEngine:
    def __init__(self, model: nn.Module, args: ModelArgs, device: torch.device, pooling: str, normalize: bool,
                 max_batch_tokens: int) -> None:
        self.args = args
        self.pooling = pooling  # "rank": a cross-encoder, which scores pairs and embeds nothing
        self.normalize = normalize
        self.device = device
        self.runner = EncoderRunner(model, device, max_batch_tokens)
        self.max_model_len = args.max_position_embeddings
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxr-encoder")
        self._closed = False
        self._prompt_tokens = 0

    @property
    def is_reranker(self) -> bool:
        return self.pooling == "rank"

    @property
    def dimensions(self) -> int:
        head = getattr(self.runner.model, "pooled_head", None)
        return head.out_features if head is not None else self.args.hidden_size

    # --- the server's calls ----------------------------------------------------------------------
    async def embed(self, ids: list[int]) -> tuple[list[float], int]:
        """One input's vector with the model's own pooling and normalisation (the routes that
        embed input by input)."""
        return (await self.embed_many([ids]))[0], len(ids)

    async def embed_many(self, inputs: list[list[int]], pooling: str | None = None, normalize: bool | None = None,
                         dimensions: int | None = None) -> list[list[float]]:
        """Vectors of token-id inputs, batched; pooling / normalize None: the model's own;
        dimensions: the first N values (Matryoshka), normalised again where the vectors are."""
        if self.is_reranker:
            raise InvalidParameterError("model", "this model is a reranker (a cross-encoder): it scores "
                                                 "(query, document) pairs at /v1/rerank and /v1/score, it embeds nothing")
        mode = pooling or self.pooling
        if mode not in POOLING_MODES:
            raise InvalidParameterError("pooling", f"must be one of {', '.join(POOLING_MODES)}, got {mode!r}")
        if dimensions is not None and not 0 < dimensions <= self.dimensions:
            raise InvalidParameterError("dimensions", f"must be between 1 and {self.dimensions}, got {dimensions}")
        norm = self.normalize if normalize is None else normalize
        vectors = await self._run(lambda: self.runner.embed([EncoderInput(i) for i in inputs], mode))
        self._prompt_tokens += sum(map(len, inputs))
        return finish(vectors, norm, dimensions).tolist()

    async def score(self, pairs: list[EncoderInput]) -> list[float]:
        """Relevance in [0, 1] of each (query, document) pair: the sigmoid of a one-label head's
        logit (sentence-transformers' CrossEncoder default), or the last label's softmax."""
        if not self.is_reranker:
            raise InvalidParameterError("model", "this model embeds; scoring needs a reranker (a cross-encoder "
                                                 "with a classification head)")
        if self.args.extra.get("type_vocab_size", 2) == 1:  # RoBERTa: one token type
            pairs = [EncoderInput(p.ids) for p in pairs]
        logits = await self._run(lambda: self.runner.classify(pairs))
        self._prompt_tokens += sum(len(p.ids) for p in pairs)
        probs = torch.sigmoid(logits[:, 0]) if logits.shape[1] == 1 else torch.softmax(logits, -1)[:, -1]
        return probs.tolist()

    async def stream(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                     stream_interval: int = 1) -> AsyncIterator[RequestOutput]:
        raise InvalidParameterError("model", "this is an embedding model (an encoder): it cannot generate text; "
                                             "use /v1/embeddings, /api/embed or, for a reranker, /v1/rerank")
        yield  # an async generator, as AsyncEngine.stream is

    def abort(self, request_id: str) -> None:
        pass  # nothing is ever streamed

    async def prompt_logprobs(self, prompt, top: int):
        raise InvalidParameterError("model", "an embedding model has no token logprobs")

    async def use_cpu_threads(self, n: int | None) -> bool:
        return False

    # --- lifecycle and stats -------------------------------------------------------------------
    async def _run(self, fn):
        if self._closed:
            raise OverloadedError("the model is unloading; retry the request")
        return await asyncio.wrap_future(self._pool.submit(fn))

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_alive(self) -> bool:
        return not self._closed

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 0, max_model_len=self.max_model_len,
                           prompt_tokens_total=self._prompt_tokens)

    def forget_counts(self, core: bool = True) -> None:
        self._prompt_tokens = 0

    def shutdown(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True)
