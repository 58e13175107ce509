"""The OpenAI-compatible API (/v1/...), and vLLM's tokenizer routes beside it."""
from __future__ import annotations

from fastapi import APIRouter

from mlxr.server.openai import chat, completions, lora, models, rerank, responses, tokenize

router = APIRouter(tags=["openai"])
router.include_router(chat.router)
router.include_router(completions.router)
router.include_router(models.router)
router.include_router(lora.router)  # vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter
router.include_router(responses.router)
router.include_router(rerank.router)  # /v1/rerank, /rerank (Cohere, Jina) and vLLM's /score
router.include_router(tokenize.router)  # vLLM's /tokenize, /detokenize, /tokenizer_info
